//! Command-line arguments of the bench examples: each is checked, and bad input ends the
//! program with one line on stderr and exit status 2 (never a panic and its backtrace).

use std::fmt::Display;
use std::ops::RangeInclusive;

/// Print `error: {message}` and the usage line, then exit with status 2.
pub fn fail(usage: &str, message: impl Display) -> ! {
    eprintln!("error: {message} (usage: {usage})");
    std::process::exit(2)
}

/// The program's arguments after its name.
pub fn args() -> Vec<String> {
    std::env::args().skip(1).collect()
}

/// `text` as a whole number in `range`, or the program ends naming `what`.
pub fn number(usage: &str, what: &str, text: &str, range: RangeInclusive<usize>) -> usize {
    read_number(what, text, range).unwrap_or_else(|message| fail(usage, message))
}

/// `text` as a whole number in `range`, or the message that says what was wrong.
pub fn read_number(what: &str, text: &str, range: RangeInclusive<usize>) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if range.contains(&n) => Ok(n),
        _ if *range.end() == usize::MAX => {
            Err(format!("{what} must be a whole number of at least {}, got '{text}'", range.start()))
        }
        _ => Err(format!("{what} must be a whole number from {} to {}, got '{text}'", range.start(), range.end())),
    }
}

/// Positional argument `i` as a whole number in `range`, or `default` when absent.
pub fn positional(
    usage: &str,
    args: &[String],
    i: usize,
    what: &str,
    range: RangeInclusive<usize>,
    default: usize,
) -> usize {
    args.get(i).map_or(default, |text| number(usage, what, text, range))
}

/// Positional argument `i`, which must be one of `choices` when present.
pub fn choice<'a>(usage: &str, args: &'a [String], i: usize, what: &str, choices: &[&str]) -> Option<&'a str> {
    let text = args.get(i)?;
    if choices.contains(&text.as_str()) {
        Some(text)
    } else {
        fail(usage, format!("{what} must be one of {}, got '{text}'", choices.join(", ")))
    }
}

/// End the program if there are more than `most` positional arguments.
pub fn at_most(usage: &str, args: &[String], most: usize) {
    if args.len() > most {
        fail(usage, format!("at most {most} arguments, got {}", args.len()));
    }
}

#[cfg(test)]
mod tests {
    use super::read_number;

    #[test]
    fn numbers_are_read_within_their_range() {
        assert_eq!(read_number("N", "12", 1..=100), Ok(12));
        assert_eq!(read_number("N", "0", 0..=1), Ok(0));
        assert_eq!(read_number("N", "0", 1..=100), Err("N must be a whole number from 1 to 100, got '0'".into()));
        assert_eq!(
            read_number("N", "x", 2..=usize::MAX),
            Err("N must be a whole number of at least 2, got 'x'".into())
        );
        assert_eq!(read_number("N", "-3", 0..=9), Err("N must be a whole number from 0 to 9, got '-3'".into()));
        assert_eq!(read_number("N", "", 0..=9), Err("N must be a whole number from 0 to 9, got ''".into()));
    }
}
