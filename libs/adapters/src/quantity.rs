//! Kubernetes quantity strings (`250m`, `4Gi`, `1e3`, `1.5G`): the one
//! quantity reader of the crate, with two exact, float-free views of what it
//! reads.
//!
//! * [`parse`] gives a [`ParsedQuantity`]: an exact integer count of
//!   nano-units, rounded and capped as the apiserver does, so admission and
//!   resource rules compare without floating point.
//! * [`parse_exact`] gives an [`ExactQuantity`]: the literal value
//!   `sign × mantissa × 10^exp10 × 2^exp2`, unrounded and uncapped, from which
//!   renderers derive integers such as Redis `--maxmemory` in bytes
//!   ([`ExactQuantity::floor_scaled`], checked `u128` arithmetic).
//!
//! Grammar (as the apiserver accepts it):
//! `[+-] <digits>[.<digits>] | [+-] .<digits>` followed by one suffix:
//! binary SI (`Ki Mi Gi Ti Pi Ei`), decimal SI (`n u m "" k M G T P E`) or a
//! decimal exponent (`e<int>` / `E<int>`). In [`parse`], precision finer than
//! one nano-unit is rounded away from zero, as the apiserver rounds up.

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
    /// Beyond what the apiserver can represent, or (for [`ExactQuantity`])
    /// beyond what its exact `u128` arithmetic can.
    #[error("{0:?} is too large")]
    TooLarge(String),
    /// A non-negative quantity was required.
    #[error("{0:?} is negative")]
    Negative(String),
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

/// A quantity string split along the grammar, before any scaling:
/// `(-1)^negative × <int_part>.<frac_part> × 10^exp10 × 2^exp2`.
struct Lexed<'a> {
    negative: bool,
    int_part: &'a str,
    frac_part: &'a str,
    /// The suffix's decimal exponent.
    exp10: i64,
    /// The suffix's binary exponent.
    exp2: u32,
}

/// The grammar, shared by [`parse`] and [`parse_exact`].
fn lex(input: &str) -> Result<Lexed<'_>, QuantityError> {
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
    let mut exp10: i64 = 0;
    let mut exp2: u32 = 0;
    match suffix {
        "" => {}
        "n" => exp10 = -9,
        "u" => exp10 = -6,
        "m" => exp10 = -3,
        "k" => exp10 = 3,
        "M" => exp10 = 6,
        "G" => exp10 = 9,
        "T" => exp10 = 12,
        "P" => exp10 = 15,
        "E" => exp10 = 18,
        "Ki" => exp2 = 10,
        "Mi" => exp2 = 20,
        "Gi" => exp2 = 30,
        "Ti" => exp2 = 40,
        "Pi" => exp2 = 50,
        "Ei" => exp2 = 60,
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
            exp10 = e.parse().map_err(|_| syntax())?;
        }
        _ => return Err(syntax()),
    }
    Ok(Lexed {
        negative,
        int_part,
        frac_part,
        exp10,
        exp2,
    })
}

/// Parses a Kubernetes quantity string into nano-units (rounded away from
/// zero below one nano-unit, capped at 2^63-1 units).
pub fn parse(input: &str) -> Result<ParsedQuantity, QuantityError> {
    let Lexed {
        negative,
        int_part,
        frac_part,
        exp10: suffix_exp10,
        exp2: mul_pow2,
    } = lex(input)?;
    let too_large = || QuantityError::TooLarge(input.to_owned());
    // Digits as an integer mantissa with a base-10 exponent.
    let digits: String = format!("{int_part}{frac_part}");
    let digits = digits.trim_start_matches('0');
    let exp10: i64 = suffix_exp10 - frac_part.len() as i64;
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
        mantissa = mantissa.checked_add(1).ok_or_else(too_large)?;
    }
    if mantissa > MAX_UNITS * NANO {
        return Err(too_large());
    }
    Ok(ParsedQuantity {
        nanos: if negative { -mantissa } else { mantissa },
    })
}

/// Largest decimal exponent an [`ExactQuantity`] with a non-zero mantissa
/// may carry: past it no `u128` answer exists anyway.
const EXACT_MAX_EXP10: i64 = 64;
/// Largest decimal exponent magnitude an [`ExactQuantity`] may carry; the
/// bound keeps the power computations short.
const EXACT_MAX_ABS_EXP10: i64 = 2 * EXACT_MAX_EXP10;

/// A quantity exactly as written: `(-1)^negative × mantissa × 10^exp10 ×
/// 2^exp2` with an integer mantissa, neither rounded nor capped at the
/// apiserver's 2^63-1 units. Renderers derive integer answers from it
/// ([`floor_scaled`](Self::floor_scaled)) without floating point.
///
/// There is deliberately no equality: `1000m` and `1` are the same value in
/// different representations; compare [`ParsedQuantity`]s instead.
#[derive(Clone, Copy, Debug)]
pub struct ExactQuantity<'a> {
    input: &'a str,
    negative: bool,
    mantissa: u128,
    exp10: i64,
    exp2: u32,
}

/// Reads a Kubernetes quantity string exactly (same grammar as [`parse`]).
///
/// Fails with [`QuantityError::TooLarge`] when the significant digits
/// (trailing fractional zeros aside) exceed a `u128`, or the decimal exponent
/// left after the fraction exceeds ±128 (or +64 for a non-zero value).
pub fn parse_exact(input: &str) -> Result<ExactQuantity<'_>, QuantityError> {
    let lexed = lex(input)?;
    let too_large = || QuantityError::TooLarge(input.to_owned());
    // Trailing fractional zeros carry no value; dropping them keeps
    // `1.000…0` inside the mantissa's range.
    let frac_part = lexed.frac_part.trim_end_matches('0');
    let mut mantissa: u128 = 0;
    for b in lexed.int_part.bytes().chain(frac_part.bytes()) {
        mantissa = mantissa
            .checked_mul(10)
            .and_then(|m| m.checked_add(u128::from(b - b'0')))
            .ok_or_else(too_large)?;
    }
    let frac_digits = i64::try_from(frac_part.len()).map_err(|_| too_large())?;
    let exp10 = lexed.exp10 - frac_digits;
    if exp10.abs() > EXACT_MAX_ABS_EXP10 || (mantissa != 0 && exp10 > EXACT_MAX_EXP10) {
        return Err(too_large());
    }
    Ok(ExactQuantity {
        input,
        negative: lexed.negative,
        mantissa,
        exp10,
        exp2: lexed.exp2,
    })
}

impl ExactQuantity<'_> {
    /// Strictly above zero.
    pub fn is_positive(&self) -> bool {
        !self.negative && self.mantissa != 0
    }

    /// Strictly below zero (`-0` is not).
    pub fn is_negative(&self) -> bool {
        self.negative && self.mantissa != 0
    }

    /// `floor(value × num / den)` in whole units for a non-negative value,
    /// computed exactly in checked `u128` arithmetic (e.g. 80% of a memory
    /// quantity in bytes is `floor_scaled(4, 5)`).
    ///
    /// Errors with [`QuantityError::Negative`] for a negative value and with
    /// [`QuantityError::TooLarge`] when `den` is zero or an intermediate
    /// product overflows `u128`.
    pub fn floor_scaled(&self, num: u128, den: u128) -> Result<u128, QuantityError> {
        if self.is_negative() {
            return Err(QuantityError::Negative(self.input.to_owned()));
        }
        let too_large = || QuantityError::TooLarge(self.input.to_owned());
        if den == 0 {
            return Err(too_large());
        }
        let binary = 1u128.checked_shl(self.exp2).ok_or_else(too_large)?;
        let top = self
            .mantissa
            .checked_mul(binary)
            .and_then(|v| v.checked_mul(num))
            .ok_or_else(too_large)?;
        if top == 0 {
            return Ok(0);
        }
        let scale = u32::try_from(self.exp10.unsigned_abs())
            .ok()
            .and_then(|e| 10u128.checked_pow(e));
        if self.exp10 >= 0 {
            let top = scale
                .and_then(|s| top.checked_mul(s))
                .ok_or_else(too_large)?;
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
        // Rounding the largest mantissa up is too large, not an overflow.
        assert!(parse("170141183460469231731687303715884105727.1n").is_err());
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

    // --- the exact view ---

    fn units(s: &str) -> u128 {
        parse_exact(s)
            .and_then(|q| q.floor_scaled(1, 1))
            .unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn exact_binary_and_decimal_si() {
        assert_eq!(units("8Gi"), 8 * (1 << 30));
        assert_eq!(units("1Ki"), 1024);
        assert_eq!(units("3Ei"), 3 * (1u128 << 60));
        assert_eq!(units("1500M"), 1_500_000_000);
        assert_eq!(units("2k"), 2000);
        assert_eq!(units("7E"), 7 * 10u128.pow(18));
        assert_eq!(units("42"), 42);
        assert_eq!(units("+42"), 42);
        // Past the apiserver cap that `parse` enforces.
        assert_eq!(units("10Ei"), 10 * (1u128 << 60));
        assert!(matches!(parse("10Ei"), Err(QuantityError::TooLarge(_))));
    }

    #[test]
    fn exact_fractions_and_sub_units_round_down() {
        assert_eq!(units("1.5Gi"), 1_610_612_736);
        assert_eq!(units(".5Ki"), 512);
        assert_eq!(units("5."), 5);
        assert_eq!(units("100m"), 0);
        assert_eq!(units("1500m"), 1);
        assert_eq!(units("2.000000000000000000000000000000000000000000000"), 2);
        assert_eq!(units("1n"), 0);
        assert_eq!(units("0.0000000000000000000000000000000000000000001"), 0);
        // No nano rounding: just below 2.5 stays below it.
        let q = parse_exact("2.4999999999999").unwrap();
        assert_eq!(q.floor_scaled(4, 5), Ok(1));
        assert_eq!(parse("2.4999999999999").unwrap().nanos(), 2_500_000_000);
    }

    #[test]
    fn exact_exponents() {
        assert_eq!(units("1e3"), 1000);
        assert_eq!(units("1E3"), 1000);
        assert_eq!(units("12e-1"), 1);
        assert_eq!(units("5e+2"), 500);
        assert_eq!(units("2.5e2"), 250);
    }

    #[test]
    fn exact_sign_and_zero() {
        let zero = parse_exact("0").unwrap();
        assert!(!zero.is_positive() && !zero.is_negative());
        let neg_zero = parse_exact("-0m").unwrap();
        assert!(!neg_zero.is_positive() && !neg_zero.is_negative());
        assert_eq!(neg_zero.floor_scaled(1, 1), Ok(0));
        let neg = parse_exact("-250m").unwrap();
        assert!(neg.is_negative());
        assert_eq!(
            neg.floor_scaled(1, 1),
            Err(QuantityError::Negative("-250m".into()))
        );
        assert!(parse_exact("250m").unwrap().is_positive());
        assert!(parse_exact("1n").unwrap().is_positive());
    }

    #[test]
    fn exact_rejects_malformed() {
        for s in [
            "",
            ".",
            "-",
            "Gi",
            "1.2.3",
            "1 Gi",
            " 1",
            "1Gb",
            "1KI",
            "1e",
            "1e+",
            "1e1.5",
            "1ki",
            "abc",
            "1Mi2",
            "--1",
            "1e99999",
            "1e9999999",
        ] {
            assert!(parse_exact(s).is_err(), "{s:?} should be invalid");
        }
    }

    #[test]
    fn exact_out_of_range_is_an_error_not_a_wrap() {
        for s in ["1e200", "1e-200", "1e65", "0e99999"] {
            assert!(
                matches!(parse_exact(s), Err(QuantityError::TooLarge(_))),
                "{s}"
            );
        }
        assert!(parse_exact("0e64").is_ok());
        assert_eq!(units("0e100"), 0);
        assert_eq!(units("1e-128"), 0);
        let big = parse_exact("999999999999999999999999Ei").unwrap();
        assert!(matches!(
            big.floor_scaled(1, 1),
            Err(QuantityError::TooLarge(_))
        ));
        assert!(matches!(
            parse_exact("1").unwrap().floor_scaled(1, 0),
            Err(QuantityError::TooLarge(_))
        ));
    }

    #[test]
    fn exact_scaled_floor_is_exact() {
        let q = parse_exact("8Gi").unwrap();
        assert_eq!(q.floor_scaled(4, 5), Ok(6_871_947_673));
        let q = parse_exact("1.1").unwrap();
        assert_eq!(q.floor_scaled(10, 1), Ok(11));
    }

    #[test]
    fn both_views_agree_within_the_cap() {
        for s in ["0", "1", "250m", "1.5Gi", "4Gi", "1e3", "12e-1", "7E", "5."] {
            let nanos = parse(s).unwrap().nanos();
            let exact = parse_exact(s)
                .unwrap()
                .floor_scaled(1_000_000_000, 1)
                .unwrap();
            assert_eq!(u128::try_from(nanos).unwrap(), exact, "{s}");
        }
    }
}
