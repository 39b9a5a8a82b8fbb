//! Property tests of `ic_adapters::quantity`, the crate's one quantity
//! reader: its exact view (`parse_exact`, `floor_scaled`) and the Redis 80%
//! maxmemory rule built on it, plus the agreement of the exact view with the
//! nano-unit view (`parse`) inside the apiserver's range.

use ic_adapters::providers::redis_maxmemory_bytes;
use ic_adapters::quantity::{QuantityError, parse, parse_exact};
use proptest::prelude::*;

const SUFFIXES: [(&str, u128, u128); 13] = [
    // (suffix, numerator, denominator) of the multiplier.
    ("", 1, 1),
    ("k", 1_000, 1),
    ("M", 1_000_000, 1),
    ("G", 1_000_000_000, 1),
    ("T", 1_000_000_000_000, 1),
    ("m", 1, 1_000),
    ("u", 1, 1_000_000),
    ("n", 1, 1_000_000_000),
    ("Ki", 1 << 10, 1),
    ("Mi", 1 << 20, 1),
    ("Gi", 1 << 30, 1),
    ("Ti", 1 << 40, 1),
    ("Pi", 1 << 50, 1),
];

fn units(s: &str) -> u128 {
    parse_exact(s)
        .and_then(|q| q.floor_scaled(1, 1))
        .unwrap_or_else(|e| panic!("{s}: {e}"))
}

proptest! {
    #[test]
    fn integer_with_suffix(n in 0u64..1_000_000_000_000, i in 0usize..SUFFIXES.len()) {
        let (suffix, num, den) = SUFFIXES[i];
        let s = format!("{n}{suffix}");
        prop_assert_eq!(units(&s), u128::from(n) * num / den);
    }

    #[test]
    fn decimal_fraction_with_suffix(
        whole in 0u64..1_000_000,
        frac in 0u64..1_000_000,
        width in 1usize..7,
        i in 0usize..SUFFIXES.len(),
    ) {
        let (suffix, num, den) = SUFFIXES[i];
        let frac = frac % 10u64.pow(width as u32);
        let s = format!("{whole}.{frac:0width$}{suffix}");
        let scale = 10u128.pow(width as u32);
        let exact_num = (u128::from(whole) * scale + u128::from(frac)) * num;
        prop_assert_eq!(units(&s), exact_num / (scale * den));
    }

    #[test]
    fn exponent_form_matches_plain(n in 0u64..1_000_000, e in 0u32..12) {
        let plain = u128::from(n) * 10u128.pow(e);
        prop_assert_eq!(units(&format!("{n}e{e}")), plain);
        prop_assert_eq!(units(&format!("{n}E+{e}")), plain);
        prop_assert_eq!(units(&format!("{plain}e-{e}")), u128::from(n));
    }

    #[test]
    fn sign_classification(n in 0u64..1_000_000, i in 0usize..SUFFIXES.len()) {
        let (suffix, _, _) = SUFFIXES[i];
        let (pos_text, neg_text) = (format!("{n}{suffix}"), format!("-{n}{suffix}"));
        let pos = parse_exact(&pos_text).unwrap();
        let neg = parse_exact(&neg_text).unwrap();
        prop_assert_eq!(pos.is_positive(), n > 0);
        prop_assert_eq!(neg.is_negative(), n > 0);
        prop_assert!(!neg.is_positive());
        // The nano-unit view, where in range, classifies the same way.
        if let (Ok(pos), Ok(neg)) = (parse(&pos_text), parse(&neg_text)) {
            prop_assert_eq!(pos.is_positive(), n > 0);
            prop_assert_eq!(neg.is_negative(), n > 0);
            prop_assert!(!neg.is_positive());
        }
    }

    #[test]
    fn maxmemory_is_floor_of_eighty_percent(n in 2u64..(1 << 40), i in 8usize..SUFFIXES.len()) {
        let (suffix, num, _) = SUFFIXES[i];
        let bytes = u128::from(n) * num;
        let m = redis_maxmemory_bytes(&format!("{n}{suffix}")).unwrap();
        prop_assert!(m * 5 <= bytes * 4);
        prop_assert!(bytes * 4 < (m + 1) * 5);
    }

    #[test]
    fn never_panics(s in "[-+]?[0-9.]{0,6}([a-zA-Z][a-z]?|[eE][-+]?[0-9]{0,3})?") {
        if let Ok(q) = parse_exact(&s) {
            let _ = q.floor_scaled(4, 5);
        }
        let _ = parse(&s);
    }

    #[test]
    fn views_agree_within_the_apiserver_range(
        n in 0u64..1_000_000_000_000,
        i in 0usize..SUFFIXES.len(),
    ) {
        // Within 2^63-1 units the nano-unit count of `parse` is the exact
        // value scaled by 1e9 (every value here is a whole nano-unit); past
        // it `parse` refuses while the exact view still answers.
        let (suffix, _, _) = SUFFIXES[i];
        let s = format!("{n}{suffix}");
        let nanos = parse_exact(&s).unwrap().floor_scaled(1_000_000_000, 1).unwrap();
        match parse(&s) {
            Ok(q) => {
                prop_assert_eq!(u128::try_from(q.nanos()).unwrap(), nanos);
                prop_assert!(nanos <= i64::MAX as u128 * 1_000_000_000);
            }
            Err(e) => {
                prop_assert!(matches!(e, QuantityError::TooLarge(_)), "{}", e);
                prop_assert!(nanos > i64::MAX as u128 * 1_000_000_000);
            }
        }
    }
}
