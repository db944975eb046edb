"""Attention kernels of the project's own, written in Triton for GPUs (`triton_flash.py`: FlashAttention-2, forward
and backward). Nothing here is imported by `attention` itself: Triton is an extra (`pip install -e '.[test]'` installs
it where it ships wheels), and without a GPU its interpreter runs the same kernels on the CPU, slowly, for checking.
"""
