//! Kubernetes quantity strings (`250m`, `4Gi`, `1e3`, `1.5G`) parsed into an
//! exact integer count of nano-units, so resource rules compare without
//! floating point.
//!
//! Grammar (as the apiserver accepts it):
//! `[+-] <digits>[.<digits>] | [+-] .<digits>` followed by one suffix:
//! binary SI (`Ki Mi Gi Ti Pi Ei`), decimal SI (`n u m "" k M G T P E`) or a
//! decimal exponent (`e<int>` / `E<int>`). Precision finer than one nano-unit
//! is rounded away from zero, as the apiserver rounds up.

use std::cmp::Ordering;

/// Nano-units per unit.
const NANO: i128 = 1_000_000_000;
/// The apiserver caps quantities at 2^63-1 units; beyond that we refuse
/// rather than risk overflow in comparisons.
const MAX_UNITS: i128 = i64::MAX as i128;

/// A parsed quantity: an exact count of nano-units (1e-9).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ParsedQuantity {
    nanos: i128,
}

/// Why a string is not a quantity.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// Empty string.
    #[error("quantity is empty")]
    Empty,
    /// Not the quantity grammar.
    #[error("{0:?} is not a Kubernetes quantity (e.g. 250m, 4Gi, 1e3)")]
    Syntax(String),
    /// Beyond what the apiserver can represent.
    #[error("{0:?} is too large")]
    TooLarge(String),
}

impl ParsedQuantity {
    /// Zero.
    pub const ZERO: Self = Self { nanos: 0 };

    /// A whole number of units.
    pub fn from_units(units: i64) -> Self {
        Self {
            nanos: i128::from(units) * NANO,
        }
    }

    /// Exact nano-unit count.
    pub fn nanos(self) -> i128 {
        self.nanos
    }

    /// Strictly below zero.
    pub fn is_negative(self) -> bool {
        self.nanos < 0
    }

    /// Strictly above zero.
    pub fn is_positive(self) -> bool {
        self.nanos > 0
    }

    /// A whole number of units (no fractional part).
    pub fn is_integer(self) -> bool {
        self.nanos % NANO == 0
    }

    /// Whole units, rounded toward zero.
    pub fn whole_units(self) -> i128 {
        self.nanos / NANO
    }

    /// `self` is a whole multiple of `unit` (which must be positive).
    pub fn is_multiple_of(self, unit: Self) -> bool {
        unit.nanos > 0 && self.nanos % unit.nanos == 0
    }
}

impl PartialOrd<i64> for ParsedQuantity {
    fn partial_cmp(&self, other: &i64) -> Option<Ordering> {
        Some(self.nanos.cmp(&(i128::from(*other) * NANO)))
    }
}

impl PartialEq<i64> for ParsedQuantity {
    fn eq(&self, other: &i64) -> bool {
        self.nanos == i128::from(*other) * NANO
    }
}

/// Parses a Kubernetes quantity string.
pub fn parse(input: &str) -> Result<ParsedQuantity, QuantityError> {
    if input.is_empty() {
        return Err(QuantityError::Empty);
    }
    let syntax = || QuantityError::Syntax(input.to_owned());
    let (negative, rest) = match input.as_bytes()[0] {
        b'-' => (true, &input[1..]),
        b'+' => (false, &input[1..]),
        _ => (false, input),
    };
    let number_end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(number_end);
    let (int_part, frac_part) = match number.split_once('.') {
        Some((i, f)) => (i, f),
        None => (number, ""),
    };
    if frac_part.contains('.') || (int_part.is_empty() && frac_part.is_empty()) {
        return Err(syntax());
    }
    // Digits as an integer mantissa with a base-10 exponent.
    let digits: String = format!("{int_part}{frac_part}");
    let digits = digits.trim_start_matches('0');
    let mut exp10: i64 = -(frac_part.len() as i64);
    let mut mul_pow2: u32 = 0;
    match suffix {
        "" => {}
        "n" => exp10 -= 9,
        "u" => exp10 -= 6,
        "m" => exp10 -= 3,
        "k" => exp10 += 3,
        "M" => exp10 += 6,
        "G" => exp10 += 9,
        "T" => exp10 += 12,
        "P" => exp10 += 15,
        "E" => exp10 += 18,
        "Ki" => mul_pow2 = 10,
        "Mi" => mul_pow2 = 20,
        "Gi" => mul_pow2 = 30,
        "Ti" => mul_pow2 = 40,
        "Pi" => mul_pow2 = 50,
        "Ei" => mul_pow2 = 60,
        s if s.starts_with(['e', 'E']) => {
            let e = &s[1..];
            let e_digits = e.strip_prefix(['+', '-']).unwrap_or(e);
            if e_digits.is_empty() || !e_digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(syntax());
            }
            // Any exponent this long is far outside the representable range.
            if e_digits.len() > 6 {
                return Err(QuantityError::TooLarge(input.to_owned()));
            }
            let value: i64 = e.parse().map_err(|_| syntax())?;
            exp10 += value;
        }
        _ => return Err(syntax()),
    }
    let too_large = || QuantityError::TooLarge(input.to_owned());
    if digits.is_empty() {
        return Ok(ParsedQuantity::ZERO);
    }
    // Scale to nano-units: value = digits * 10^exp10 * 2^mul_pow2 * 1e9.
    let shift = exp10 + 9;
    // More than 40 significant digits cannot be below the cap after scaling
    // unless most of them are dropped as sub-nano precision.
    let mut mantissa: i128 = 0;
    let mut dropped_nonzero = false;
    let keep = if shift >= 0 {
        digits.len()
    } else {
        let drop = usize::try_from(-shift).unwrap_or(usize::MAX);
        let keep = digits.len().saturating_sub(drop);
        dropped_nonzero = digits[keep..].bytes().any(|b| b != b'0');
        keep
    };
    for b in digits[..keep].bytes() {
        mantissa = mantissa
            .checked_mul(10)
            .and_then(|m| m.checked_add(i128::from(b - b'0')))
            .ok_or_else(too_large)?;
    }
    if shift > 0 {
        let pow = u32::try_from(shift).map_err(|_| too_large())?;
        let factor = 10i128.checked_pow(pow).ok_or_else(too_large)?;
        mantissa = mantissa.checked_mul(factor).ok_or_else(too_large)?;
    }
    mantissa = mantissa
        .checked_mul(1i128 << mul_pow2)
        .ok_or_else(too_large)?;
    if dropped_nonzero {
        // Round away from zero, as the apiserver does for sub-nano precision.
        mantissa += 1;
    }
    if mantissa > MAX_UNITS * NANO {
        return Err(too_large());
    }
    Ok(ParsedQuantity {
        nanos: if negative { -mantissa } else { mantissa },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> i128 {
        parse(s).unwrap_or_else(|e| panic!("{s}: {e}")).nanos()
    }

    #[test]
    fn decimal_si() {
        assert_eq!(n("1"), NANO);
        assert_eq!(n("250m"), 250_000_000);
        assert_eq!(n("1n"), 1);
        assert_eq!(n("3u"), 3_000);
        assert_eq!(n("1k"), 1_000 * NANO);
        assert_eq!(n("1.5G"), 1_500_000_000 * NANO);
        assert_eq!(n("2E"), 2_000_000_000_000_000_000 * NANO);
        assert_eq!(n("0.5"), NANO / 2);
        assert_eq!(n(".5"), NANO / 2);
        assert_eq!(n("5."), 5 * NANO);
        assert_eq!(n("+7"), 7 * NANO);
    }

    #[test]
    fn binary_si() {
        assert_eq!(n("1Ki"), 1024 * NANO);
        assert_eq!(n("2Mi"), 2 * 1024 * 1024 * NANO);
        assert_eq!(n("4Gi"), 4 * (1 << 30) * NANO);
        assert_eq!(n("1.5Gi"), 3 * (1 << 29) * NANO);
        assert_eq!(n("1Ei"), (1i128 << 60) * NANO);
    }

    #[test]
    fn exponents() {
        assert_eq!(n("1e3"), 1_000 * NANO);
        assert_eq!(n("1E3"), 1_000 * NANO);
        assert_eq!(n("1e-3"), 1_000_000);
        assert_eq!(n("12e+2"), 1_200 * NANO);
        assert_eq!(n("1.5e1"), 15 * NANO);
    }

    #[test]
    fn signs_zero_and_rounding() {
        assert_eq!(n("-1"), -NANO);
        assert_eq!(n("-250m"), -250_000_000);
        assert_eq!(n("0"), 0);
        assert_eq!(n("000"), 0);
        assert_eq!(n("0Gi"), 0);
        // Sub-nano precision rounds away from zero.
        assert_eq!(n("0.0000000001"), 1);
        assert_eq!(n("-1e-12"), -1);
    }

    #[test]
    fn comparisons_are_exact() {
        assert!(parse("1Gi").unwrap() > parse("1G").unwrap());
        assert_eq!(parse("1000m").unwrap(), parse("1").unwrap());
        assert_eq!(parse("1024Ki").unwrap(), parse("1Mi").unwrap());
        assert!(parse("500m").unwrap() < 1);
        assert!(parse("2").unwrap().is_integer());
        assert!(!parse("500m").unwrap().is_integer());
        assert!(parse("4Mi").unwrap().is_multiple_of(parse("2Mi").unwrap()));
        assert!(!parse("3Mi").unwrap().is_multiple_of(parse("2Mi").unwrap()));
    }

    #[test]
    fn rejects_garbage() {
        for s in [
            "", "abc", "1.2.3", "1Gb", "1 Gi", "Gi", ".", "-", "1e", "1e+", "1ee3", "1ki", "0x10",
            "1i",
        ] {
            assert!(parse(s).is_err(), "{s:?} parsed");
        }
        assert!(matches!(parse("1e100"), Err(QuantityError::TooLarge(_))));
        assert!(matches!(parse("10Ei"), Err(QuantityError::TooLarge(_))));
        assert!(matches!(
            parse("1e9999999"),
            Err(QuantityError::TooLarge(_))
        ));
    }
}
