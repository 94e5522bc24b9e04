"""Chat templates: the Jinja template a model ships (GGUF ``tokenizer.chat_template``, or
``chat_template`` in a Hugging Face folder's ``tokenizer_config.json``) rendered as
transformers' ``apply_chat_template(..., tokenize=False)`` renders it::

    text = apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        dec.chat_template,
        add_generation_prompt=True,
    )
    ids = dec.tokenizer.encode(text, add_special_tokens=False).ids

For SmolLM2-Instruct (ChatML) that is ``<|im_start|>system\\nYou are a helpful AI assistant
named SmolLM, trained by Hugging Face<|im_end|>\\n<|im_start|>user\\nWhat is the capital of
France?<|im_end|>\\n<|im_start|>assistant\\n``. The template runs in Jinja's sandbox with
transformers' settings (``trim_blocks``, ``lstrip_blocks``, loop controls, ``raise_exception``,
its ``tojson``). Not its ``strftime_now``: a template that asks for today's date (Llama 3.x's)
gets its own fixed fallback, so a run's prompts do not change with the day it runs.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

from cudt.models.hf import ModelFolderError

__all__ = ["apply_chat_template"]


@functools.lru_cache(maxsize=16)
def _compile(template: str) -> Any:
    try:
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ModuleNotFoundError as err:
        raise ModelFolderError("chat templates need jinja2: pip install 'jinja2>=3.1'") from err

    def raise_exception(message: str) -> None:
        raise ModelFolderError(f"the chat template refused the messages: {message}")

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
        # transformers' filter: Jinja's own escapes <, >, & and ' for HTML, which a prompt is not
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.globals["raise_exception"] = raise_exception
    env.filters["tojson"] = tojson
    # not transformers' strftime_now: a template that reads today's date (Llama 3.x's) would
    # write other training tokens each day; it falls back to its own fixed date here
    try:
        return env.from_string(template)
    except jinja2.TemplateSyntaxError as err:
        raise ModelFolderError(
            f"the chat template is not valid Jinja ({err.message}, line {err.lineno}): fix the "
            "model's chat_template"
        ) from err


def apply_chat_template(
    messages: Sequence[Mapping[str, str]],
    template: str | None,
    *,
    add_generation_prompt: bool = False,
    **variables: Any,
) -> str:
    """Render ``messages`` (``[{"role": "system" | "user" | "assistant", "content": str}, ...]``)
    with a model's Jinja chat ``template`` (``dec.chat_template``).

    ``add_generation_prompt=True`` appends the opening of an assistant turn (a prompt for
    generation); ``variables`` are passed to the template (e.g. ``bos_token``, ``eos_token``).
    Returns the text, special tokens written out (tokenize it with specials parsed, without
    adding a BOS). A missing template, or bad messages, raise one line."""
    if not template:
        raise ModelFolderError(
            "this model has no chat template: format prompts yourself (e.g. "
            "--prompt-format alpaca), or load a model whose file carries one"
        )
    bad = [
        i
        for i, m in enumerate(messages)
        if not isinstance(m, Mapping)
        or not isinstance(m.get("role"), str)
        or not isinstance(m.get("content"), str)
    ]
    if bad:
        raise ModelFolderError(
            f"messages {bad} are not {{'role': str, 'content': str}} dicts: give every message "
            "a role and a text content"
        )
    return _compile(template).render(
        messages=[dict(m) for m in messages],
        add_generation_prompt=add_generation_prompt,
        **variables,
    )
