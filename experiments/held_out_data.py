"""The held-out data sets (issue 47), written to a folder; never used to choose anything.

    python -m experiments.held_out_data plaza DIR --layout avenue --train-videos 9 --test-videos 3
    python -m experiments.held_out_data forum DIR --train 2000 --test 400

then ``python -m experiments.video_denoise --dataset avenue --data-dir 'DIR/Avenue Dataset'`` or
``python -m experiments.text_classify --dataset aclimdb --data-dir DIR/aclImdb``. The writers
are ``cudt.data.video.plaza`` and ``cudt.data.text.forum``; the command is
``cudt.data.held_out.main``.
"""

import sys

from cudt.data.held_out import main

if __name__ == "__main__":
    sys.exit(main())
