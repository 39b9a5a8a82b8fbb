//! An exact Kubernetes resource-quantity reader.
//!
//! Renderers need integer answers from quantities (Redis `--maxmemory` in
//! bytes, "is this CPU request positive?"), and floats would make the
//! rendered bytes depend on rounding. A quantity is therefore read into
//! `sign × mantissa × 10^exp10 × 2^exp2` with an integer mantissa, and every
//! answer is computed from that with checked `u128` arithmetic.
//!
//! The grammar is the apiserver's: an optionally signed decimal number
//! (`1`, `1.5`, `.5`, `5.`) followed by one suffix — binary SI (`Ki` … `Ei`),
//! decimal SI (`n`, `u`, `m`, none, `k`, `M`, `G`, `T`, `P`, `E`) or a decimal
//! exponent (`e3`, `E-2`, `e+6`).

use thiserror::Error;

/// Why a quantity string could not be read.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum QuantityError {
    /// The string is not a Kubernetes quantity.
    #[error("{0:?} is not a valid quantity")]
    Invalid(String),
    /// Valid, but outside what the exact arithmetic here can represent.
    #[error("quantity {0:?} is out of the supported range")]
    OutOfRange(String),
    /// A non-negative quantity was required.
    #[error("quantity {0:?} is negative")]
    Negative(String),
}

/// A parsed quantity: `(-1)^negative × mantissa × 10^exp10 × 2^exp2`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParsedQuantity {
    negative: bool,
    mantissa: u128,
    exp10: i32,
    exp2: u32,
}

/// Largest decimal exponent accepted; anything past it cannot fit a `u128`
/// answer anyway, and the bound keeps the power loops short.
const MAX_EXP10: i32 = 64;

impl ParsedQuantity {
    /// True when the value is strictly greater than zero.
    pub fn is_positive(&self) -> bool {
        !self.negative && self.mantissa != 0
    }

    /// True when the value is strictly below zero.
    pub fn is_negative(&self) -> bool {
        self.negative && self.mantissa != 0
    }

    /// `floor(value × num / den)` for a non-negative value, exactly.
    ///
    /// `den` must be non-zero. Errors when the value is negative or the
    /// intermediate product overflows `u128`.
    pub fn floor_scaled(&self, num: u128, den: u128, text: &str) -> Result<u128, QuantityError> {
        if self.is_negative() {
            return Err(QuantityError::Negative(text.to_owned()));
        }
        let range = || QuantityError::OutOfRange(text.to_owned());
        if den == 0 {
            return Err(range());
        }
        let binary = 1u128.checked_shl(self.exp2).ok_or_else(range)?;
        let mut top = self
            .mantissa
            .checked_mul(binary)
            .and_then(|v| v.checked_mul(num))
            .ok_or_else(range)?;
        if top == 0 {
            return Ok(0);
        }
        let scale = pow10(self.exp10.unsigned_abs());
        if self.exp10 >= 0 {
            top = scale.and_then(|s| top.checked_mul(s)).ok_or_else(range)?;
            Ok(top / den)
        } else {
            // A denominator past u128::MAX exceeds every representable
            // numerator, so the floor is exactly zero.
            match scale.and_then(|s| s.checked_mul(den)) {
                Some(bottom) => Ok(top / bottom),
                None => Ok(0),
            }
        }
    }

    /// The value as whole units, rounded down (bytes for memory).
    pub fn floor_units(&self, text: &str) -> Result<u128, QuantityError> {
        self.floor_scaled(1, 1, text)
    }
}

fn pow10(exp: u32) -> Option<u128> {
    10u128.checked_pow(exp)
}

/// Reads a Kubernetes quantity string exactly.
pub fn parse_quantity(text: &str) -> Result<ParsedQuantity, QuantityError> {
    let invalid = || QuantityError::Invalid(text.to_owned());
    let range = || QuantityError::OutOfRange(text.to_owned());

    let (negative, rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let number_len = rest
        .bytes()
        .take_while(|b| b.is_ascii_digit() || *b == b'.')
        .count();
    let (number, suffix) = rest.split_at(number_len);
    let (whole, fraction) = match number.split_once('.') {
        Some((w, f)) => (w, f),
        None => (number, ""),
    };
    if fraction.contains('.') || (whole.is_empty() && fraction.is_empty()) {
        return Err(invalid());
    }
    // Trailing fractional zeros carry no value; dropping them keeps
    // `1.000…0` inside the mantissa's range.
    let fraction = fraction.trim_end_matches('0');

    let mut mantissa: u128 = 0;
    for digit in whole.bytes().chain(fraction.bytes()) {
        mantissa = mantissa
            .checked_mul(10)
            .and_then(|m| m.checked_add(u128::from(digit - b'0')))
            .ok_or_else(range)?;
    }
    let fraction_digits = i32::try_from(fraction.len()).map_err(|_| range())?;

    let (suffix_exp10, exp2) = parse_suffix(suffix).ok_or_else(invalid)?;
    let exp10 = suffix_exp10
        .checked_sub(fraction_digits)
        .filter(|e| e.abs() <= MAX_EXP10 * 2)
        .ok_or_else(range)?;
    if mantissa != 0 && exp10 > MAX_EXP10 {
        return Err(range());
    }
    Ok(ParsedQuantity {
        negative,
        mantissa,
        exp10,
        exp2,
    })
}

/// `(exp10, exp2)` of a suffix, or `None` when it is not one.
fn parse_suffix(suffix: &str) -> Option<(i32, u32)> {
    let binary = match suffix {
        "Ki" => Some(10),
        "Mi" => Some(20),
        "Gi" => Some(30),
        "Ti" => Some(40),
        "Pi" => Some(50),
        "Ei" => Some(60),
        _ => None,
    };
    if let Some(exp2) = binary {
        return Some((0, exp2));
    }
    let decimal = match suffix {
        "n" => Some(-9),
        "u" => Some(-6),
        "m" => Some(-3),
        "" => Some(0),
        "k" => Some(3),
        "M" => Some(6),
        "G" => Some(9),
        "T" => Some(12),
        "P" => Some(15),
        "E" => Some(18),
        _ => None,
    };
    if let Some(exp10) = decimal {
        return Some((exp10, 0));
    }
    let exponent = suffix
        .strip_prefix('e')
        .or_else(|| suffix.strip_prefix('E'))?;
    let digits = exponent
        .strip_prefix('-')
        .or_else(|| exponent.strip_prefix('+'))
        .unwrap_or(exponent);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || digits.len() > 4 {
        return None;
    }
    let value: i32 = exponent.parse().ok()?;
    Some((value, 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn units(s: &str) -> u128 {
        parse_quantity(s)
            .and_then(|q| q.floor_units(s))
            .unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn binary_and_decimal_si() {
        assert_eq!(units("8Gi"), 8 * (1 << 30));
        assert_eq!(units("1Ki"), 1024);
        assert_eq!(units("3Ei"), 3 * (1u128 << 60));
        assert_eq!(units("1500M"), 1_500_000_000);
        assert_eq!(units("2k"), 2000);
        assert_eq!(units("7E"), 7 * 10u128.pow(18));
        assert_eq!(units("42"), 42);
        assert_eq!(units("+42"), 42);
    }

    #[test]
    fn fractions_and_sub_units_round_down() {
        assert_eq!(units("1.5Gi"), 1_610_612_736);
        assert_eq!(units(".5Ki"), 512);
        assert_eq!(units("5."), 5);
        assert_eq!(units("100m"), 0);
        assert_eq!(units("1500m"), 1);
        assert_eq!(units("2.000000000000000000000000000000000000000000000"), 2);
        assert_eq!(units("1n"), 0);
        assert_eq!(units("0.0000000000000000000000000000000000000000001"), 0);
    }

    #[test]
    fn exponents() {
        assert_eq!(units("1e3"), 1000);
        assert_eq!(units("1E3"), 1000);
        assert_eq!(units("12e-1"), 1);
        assert_eq!(units("5e+2"), 500);
        assert_eq!(units("2.5e2"), 250);
    }

    #[test]
    fn sign_and_zero() {
        let zero = parse_quantity("0").unwrap();
        assert!(!zero.is_positive() && !zero.is_negative());
        let neg_zero = parse_quantity("-0m").unwrap();
        assert!(!neg_zero.is_positive() && !neg_zero.is_negative());
        let neg = parse_quantity("-250m").unwrap();
        assert!(neg.is_negative());
        assert_eq!(
            neg.floor_units("-250m"),
            Err(QuantityError::Negative("-250m".into()))
        );
        assert!(parse_quantity("250m").unwrap().is_positive());
        assert!(parse_quantity("1n").unwrap().is_positive());
    }

    #[test]
    fn rejects_malformed() {
        for s in [
            "", ".", "-", "Gi", "1.2.3", "1 Gi", " 1", "1Gb", "1KI", "1e", "1e+", "1e1.5", "1ki",
            "abc", "1Mi2", "--1", "1e99999",
        ] {
            assert!(
                matches!(parse_quantity(s), Err(QuantityError::Invalid(_))),
                "{s:?} should be invalid"
            );
        }
    }

    #[test]
    fn out_of_range_is_an_error_not_a_wrap() {
        assert!(matches!(
            parse_quantity("1e200"),
            Err(QuantityError::OutOfRange(_))
        ));
        let big = parse_quantity("999999999999999999999999Ei").unwrap();
        assert!(matches!(
            big.floor_units("x"),
            Err(QuantityError::OutOfRange(_))
        ));
    }

    #[test]
    fn scaled_floor_is_exact() {
        let q = parse_quantity("8Gi").unwrap();
        assert_eq!(q.floor_scaled(4, 5, "8Gi"), Ok(6_871_947_673));
        let q = parse_quantity("1.1").unwrap();
        assert_eq!(q.floor_scaled(10, 1, "1.1"), Ok(11));
    }
}
