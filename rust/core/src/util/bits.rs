//! Bit tricks on the packed rows of a buddy bunch (see `buddy`): a row of `n` nodes is an
//! `n`-bit mask, and moving between a row and the row below doubles or halves the mask.

/// Spread the low 32 bits of `x` so that bit `i` lands on bit `2i` (a Morton "part 1 by 1").
#[inline]
pub(crate) const fn part1by1(x: u64) -> u64 {
    let mut x = x & 0xFFFF_FFFF;
    x = (x | (x << 16)) & 0x0000_FFFF_0000_FFFF;
    x = (x | (x << 8)) & 0x00FF_00FF_00FF_00FF;
    x = (x | (x << 4)) & 0x0F0F_0F0F_0F0F_0F0F;
    x = (x | (x << 2)) & 0x3333_3333_3333_3333;
    (x | (x << 1)) & 0x5555_5555_5555_5555
}

/// The inverse of [`part1by1`]: gather the even bits of `x` into the low 32 bits.
#[inline]
pub(crate) const fn compact1by1(x: u64) -> u64 {
    let mut x = x & 0x5555_5555_5555_5555;
    x = (x | (x >> 1)) & 0x3333_3333_3333_3333;
    x = (x | (x >> 2)) & 0x0F0F_0F0F_0F0F_0F0F;
    x = (x | (x >> 4)) & 0x00FF_00FF_00FF_00FF;
    x = (x | (x >> 8)) & 0x0000_FFFF_0000_FFFF;
    (x | (x >> 16)) & 0x0000_0000_FFFF_FFFF
}

/// Row to the row below: each node's bit covers both of its children.
#[inline]
pub(crate) const fn to_children(row: u64) -> u64 {
    let p = part1by1(row);
    p | (p << 1)
}

/// Row to the row above: a parent's bit is set when either child's is.
#[inline]
pub(crate) const fn to_parents(row: u64) -> u64 {
    compact1by1(row | (row >> 1))
}

/// A mask of the low `n` bits (`n` <= 64).
#[inline]
pub(crate) const fn low_bits(n: u32) -> u64 {
    if n >= 64 {
        u64::MAX
    } else {
        (1u64 << n) - 1
    }
}

/// Bits at every `step`-th position (`step` a power of two): the nodes of a row whose index is a
/// multiple of `step`.
#[inline]
pub(crate) const fn every_nth(step: u64) -> u64 {
    let mut mask = 0u64;
    let mut i = 0u64;
    while i < 64 {
        mask |= 1 << i;
        i += step;
    }
    mask
}

/// Swap each even bit with the odd bit next to it: a row mask of every node's sibling.
#[inline]
pub(crate) const fn siblings(row: u64) -> u64 {
    ((row & 0x5555_5555_5555_5555) << 1) | ((row >> 1) & 0x5555_5555_5555_5555)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn spreading_and_gathering_are_inverse() {
        for x in [0u64, 1, 0b1011, 0xFFFF_FFFF, 0x8000_0001, 0x1234_5678] {
            assert_eq!(compact1by1(part1by1(x)), x);
        }
    }

    #[test]
    fn children_and_parents() {
        assert_eq!(to_children(0b101), 0b11_00_11);
        assert_eq!(to_children(0xFFFF_FFFF), u64::MAX);
        assert_eq!(to_parents(0b10_00_01), 0b101);
        assert_eq!(to_parents(0b11_00_00), 0b100);
        for x in 0u64..256 {
            assert_eq!(to_parents(to_children(x)), x);
        }
    }

    #[test]
    fn masks() {
        assert_eq!(low_bits(0), 0);
        assert_eq!(low_bits(5), 0b11111);
        assert_eq!(low_bits(64), u64::MAX);
        assert_eq!(every_nth(1), u64::MAX);
        assert_eq!(every_nth(2), 0x5555_5555_5555_5555);
        assert_eq!(every_nth(32), 0x0000_0001_0000_0001);
        assert_eq!(siblings(0b0110), 0b1001);
        assert_eq!(siblings(0b0001), 0b0010);
    }
}
