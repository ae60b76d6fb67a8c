//! The one-pass greedy token ([`checked_argmax`]) against the two passes it replaces
//! ([`check_logits`], then [`argmax`]): the same token (the first of tied maxima) or the same
//! error, on vectors of every length around the lane width, with ties, NaN, ±inf and rows that
//! are all −inf.

use proptest::prelude::*;
use treespec_core::dist::argmax;
use treespec_core::sampling::{check_logits, checked_argmax};

fn reference(logits: &[f32]) -> treespec_core::Result<u32> {
    check_logits(logits).map(|()| argmax(logits))
}

/// Values from a small set, so that ties and special values are common.
fn logit() -> impl Strategy<Value = f32> {
    prop_oneof![
        8 => (-4i32..4).prop_map(|v| v as f32 * 0.5),
        1 => Just(f32::NEG_INFINITY),
        1 => Just(f32::INFINITY),
        1 => Just(f32::NAN),
        2 => any::<f32>().prop_filter("finite", |v| v.is_finite()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    #[test]
    fn one_pass_equals_check_then_argmax(logits in prop::collection::vec(logit(), 0..70)) {
        let fast = checked_argmax(&logits);
        let slow = reference(&logits);
        prop_assert_eq!(format!("{fast:?}"), format!("{slow:?}"), "logits {:?}", logits);
    }

    #[test]
    fn finite_rows_give_the_first_maximum(logits in prop::collection::vec(-3i32..3, 1..100)) {
        let logits: Vec<f32> = logits.into_iter().map(|v| v as f32).collect();
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let first = logits.iter().position(|&v| v == max).unwrap() as u32;
        prop_assert_eq!(checked_argmax(&logits).unwrap(), first);
    }
}

#[test]
fn a_vocabulary_sized_row_with_its_maximum_in_the_tail_or_repeated() {
    let mut row: Vec<f32> = (0..151_936).map(|i| ((i * 7919) % 1000) as f32 * 1e-3).collect();
    row[151_935] = 2.0;
    assert_eq!(checked_argmax(&row).unwrap(), 151_935);
    row[17] = 2.0;
    assert_eq!(checked_argmax(&row).unwrap(), 17);
    row[3] = f32::NAN;
    assert_eq!(format!("{:?}", checked_argmax(&row)), format!("{:?}", reference(&row)));
}
