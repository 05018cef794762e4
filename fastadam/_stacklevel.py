"""``caller_stacklevel()``: the ``stacklevel`` that makes a warning point at the user's code.

A warning raised deep inside fastadam (an optimizer's step, a checkpoint load) should name the
line of the caller that made the call, not a line of fastadam: this counts the frames from the
caller of ``caller_stacklevel`` outwards while they are inside the fastadam package."""
import os
import sys

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def caller_stacklevel() -> int:
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame, level = frame.f_back, level + 1
    return level
