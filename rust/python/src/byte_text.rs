//! Byte counts written for people in error messages and in the text of typed results, as
//! `npumem.sizes.format_bytes` writes them everywhere else in npumem: the largest binary unit
//! that keeps the number at least 1, one decimal, thousands separated by commas, and below
//! 1 KiB the plain count (`"1.5 KiB"`, `"1,024.0 TiB"`, `"1000 B"`). Written here rather than
//! by calling the Python function: a failing allocation's message writes three counts, and
//! three calls into Python cost more than the rest of its error. `tests/test_byte_text.py`
//! checks the two agree over sizes from bytes to exbibytes, the ties of the rounding included.

/// The units of `npumem.sizes.format_bytes`, largest first.
const UNITS: [(&str, u64); 4] = [("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];

/// `n` bytes for people (see the module documentation).
pub(crate) fn format_bytes(n: usize) -> String {
    let Some(&(name, per_unit)) = UNITS.iter().find(|&&(_, per_unit)| n as u64 >= per_unit) else {
        return format!("{n} B");
    };
    // Python divides the two integers exactly and rounds once; a division by a power of two
    // of the count rounded to a float is the same number. Both round the one decimal to the
    // nearest, ties to even.
    let scaled = format!("{:.1}", n as f64 / per_unit as f64);
    let (whole, fraction) = scaled.split_once('.').unwrap_or((&scaled, "0"));
    format!("{}.{fraction} {name}", group_thousands(whole))
}

/// `n` bytes for people, and exactly: `"1.5 MiB (1572864 bytes)"`; below 1 KiB just the bytes.
pub(crate) fn exact(n: usize) -> String {
    if n >= 1024 {
        format!("{} ({n} bytes)", format_bytes(n))
    } else {
        format!("{n} bytes")
    }
}

/// The digits of a whole number in groups of three: `"12345"` -> `"12,345"`.
pub(crate) fn group_thousands(digits: &str) -> String {
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    out
}
