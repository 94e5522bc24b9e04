"""Discrete cosine transform bases and dictionaries (NumPy, float64, built once at init).

* ``dct_matrix(n)``: the orthonormal DCT-II matrix ``C`` with ``C[k, i]`` the ``k``-th cosine
  sampled at pixel ``i``; ``C @ x`` is the DCT of ``x`` and ``C @ C.T = C.T @ C = I``.
* ``dct2_dictionary(patch, atoms_per_dim)``: a 2-D separable DCT dictionary ``D [patch**2, K]``
  whose columns are atoms for row-major flattened ``patch x patch`` patches, ``K =
  atoms_per_dim**2``. ``atoms_per_dim == patch`` gives the orthonormal 2-D DCT (``D.T @ D = I``);
  ``atoms_per_dim > patch`` gives the standard overcomplete DCT (unit-norm atoms, zero-mean
  non-DC atoms).

Note that the overcomplete dictionary is NOT a tight frame: the eigenvalues of ``D @ D.T`` for
``patch=16, atoms_per_dim=20`` span roughly ``[1, 2.58]``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["dct1_dictionary", "dct2_dictionary", "dct_matrix"]


def dct_matrix(n: int) -> np.ndarray:
    """Orthonormal DCT-II matrix.

    Args:
        n: signal length.

    Returns:
        ``C`` of shape ``[n, n]`` (row ``k`` = frequency ``k``), with ``C @ C.T = I``.
    """
    if n < 1:
        raise ValueError(f"n must be positive, got {n}")
    k = np.arange(n)[:, None]
    i = np.arange(n)[None, :]
    c = np.cos(np.pi * (2 * i + 1) * k / (2 * n)) * np.sqrt(2.0 / n)
    c[0] /= np.sqrt(2.0)
    return c


def dct1_dictionary(length: int, num_atoms: int) -> np.ndarray:
    """1-D (possibly overcomplete) DCT dictionary.

    Atom ``k`` samples ``cos(pi * (2i + 1) * k / (2 * num_atoms))`` at pixels ``i``, i.e. the
    DCT-II cosines on a frequency grid refined by ``num_atoms / length``. Sampling on the DCT-II
    grid (rather than ``cos(pi * i * k / num_atoms)``) makes ``num_atoms == length`` coincide
    exactly with the orthonormal DCT, so one construction covers both cases.

    Returns:
        ``[length, num_atoms]`` with unit-norm columns; every non-DC column has zero mean.
    """
    if num_atoms < length:
        raise ValueError(f"need num_atoms >= length, got {num_atoms} < {length}")
    i = np.arange(length)[:, None]
    k = np.arange(num_atoms)[None, :]
    d = np.cos(np.pi * (2 * i + 1) * k / (2 * num_atoms))
    # Non-DC atoms must not carry a DC component, otherwise the overcomplete frame would spend
    # many atoms on the patch mean; for num_atoms == length this is already exactly zero.
    d[:, 1:] -= d[:, 1:].mean(axis=0, keepdims=True)
    d /= np.linalg.norm(d, axis=0, keepdims=True)
    return d


def dct2_dictionary(patch: int = 16, atoms_per_dim: int | None = None) -> np.ndarray:
    """2-D separable DCT dictionary for row-major flattened square patches.

    Args:
        patch: patch side length (tokens have ``patch * patch`` values).
        atoms_per_dim: number of 1-D atoms per axis (``>= patch``); ``None`` means ``patch``
            (orthonormal basis).

    Returns:
        ``D`` of shape ``[patch**2, atoms_per_dim**2]``; column ``k1 * atoms_per_dim + k2`` is
        the outer product of 1-D atoms ``k1`` (vertical) and ``k2`` (horizontal), flattened
        row-major. Columns have unit norm.
    """
    m = patch if atoms_per_dim is None else atoms_per_dim
    d1 = dct1_dictionary(patch, m)
    # kron(d1, d1)[i1 * patch + i2, k1 * m + k2] = d1[i1, k1] * d1[i2, k2]: the separable atom.
    return np.kron(d1, d1)
