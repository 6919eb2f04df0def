//! Small statistics shared by the simulator's calibration, the GPU backend
//! and the tests.

/// The median of `xs`, ignoring NaNs: the middle value, or the mean of the
/// two middle values for an even count; `None` when no value is left.
/// Infinities are ordinary ordered values. Sorts a copy with
/// [`f64::total_cmp`], so it never panics. Takes `f32` times (CUDA events)
/// as well as `f64`.
pub fn median<T: Copy + Into<f64>>(xs: &[T]) -> Option<f64> {
    let mut v: Vec<f64> = xs
        .iter()
        .map(|&x| x.into())
        .filter(|x: &f64| !x.is_nan())
        .collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[7.5]), Some(7.5));
        assert_eq!(median::<f64>(&[]), None);
    }

    #[test]
    fn f32_times_too() {
        assert_eq!(median(&[3.0f32, 1.0, 2.0, 4.0]), Some(2.5));
    }

    #[test]
    fn nans_are_ignored() {
        assert_eq!(median(&[f64::NAN, 1.0, 3.0, f64::NAN, 2.0]), Some(2.0));
        assert_eq!(median(&[f64::NAN, -f64::NAN]), None);
    }

    #[test]
    fn infinities_and_signed_zeros_are_ordered() {
        assert_eq!(median(&[f64::INFINITY, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[f64::NEG_INFINITY, 1.0, f64::INFINITY]), Some(1.0));
        assert_eq!(median(&[-0.0, 0.0, 5.0]), Some(0.0));
    }
}
