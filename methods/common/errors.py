"""The exceptions the methods raise for a bad argument, by the interfaces' declared convention.

TypeError: a tensor of the wrong dtype class (integer or bool where floating-point values are needed,
floating or complex where integer ids are needed). ValueError: the right kind with a wrong value (a shape,
a range, a mask value other than 0/1, a non-finite value at a valid position, a count that is not an
integer >= 1).
"""

from __future__ import annotations


class DtypeError(TypeError, ValueError):
    """A tensor of the wrong dtype class: a TypeError by the convention. It is also a ValueError because the
    argument contracts written before the convention was declared expect ValueError for it; a candidate that
    raises a plain TypeError follows the convention."""
