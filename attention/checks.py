"""Argument checks shared by the modules outside the copyable implementation files.

The implementation files under `attention/causal/` and `attention/general.py` import only torch, so
they carry their own (marked) checks; every other module checks its arguments with these.
"""

import argparse

import torch


def check_int(name, value, minimum=1):
    """Raise `TypeError` unless `value` is an int (a bool is not), `ValueError` if it is below `minimum`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {name}={value!r}")
    if value < minimum:
        bound = {0: "non-negative", 1: "positive"}.get(minimum, f"at least {minimum}")
        raise ValueError(f"{name} must be {bound}, got {name}={value}")


def check_index_tensor(name, value, dims):
    """Raise a clear error unless `value` is an integer tensor with a number of dimensions in `dims`."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got {name}.dtype={value.dtype}")
    if value.dim() not in dims:
        raise ValueError(f"{name} must have {' or '.join(map(str, dims))} dimensions, got {name}.shape={tuple(value.shape)}")


def positive_int_option(text):
    """An `argparse` type for a command-line option: `text` as a positive int, else a usage error naming the value."""
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)
