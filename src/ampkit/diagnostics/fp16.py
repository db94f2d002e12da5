"""fp16's limits, stated once, with the rounding rules that decide what a cast does.

Every number here is exact in fp32 (powers of two or fp16 values), so comparisons against them
predict `x.to(torch.float16)` bit for bit when `x` is fp32 (round-to-nearest-even).
"""

from __future__ import annotations

FP16_MAX = 65504.0
"""Largest finite fp16 value."""
FP16_OVERFLOW_AT = 65520.0
"""|x| >= this rounds to inf in a cast (the midpoint between 65504 and 2^16 ties to the even 2^16 = inf)."""
FP16_NEAR_MAX = FP16_MAX / 2
"""|x| above half the maximum: one doubling (a loss-scale growth, a residual add) from overflow."""
FP16_MIN_NORMAL = 2.0**-14
"""Smallest normal fp16 value (6.10e-5); below it values are subnormal and lose precision."""
FP16_MIN_SUBNORMAL = 2.0**-24
"""Smallest positive fp16 value (5.96e-8)."""
FP16_FLUSH_AT = 2.0**-25
"""|x| <= this becomes exactly 0 in a cast: half the smallest subnormal, and the tie rounds to the even 0."""
