//! Host-side helpers shared by the GPU test files: bf16 conversion, test
//! data and the relative-error check.
#![allow(dead_code)]

/// f32 → bf16 bits, round to nearest even.
pub fn f2b(f: f32) -> u16 {
    if f.is_nan() {
        return 0x7fc0;
    }
    let u = f.to_bits();
    ((u + 0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

pub fn b2f(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// Deterministic ~U(-1,1) bf16 data.
pub fn rand(n: usize, seed: u64) -> Vec<u16> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            f2b(((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0)
        })
        .collect()
}

/// ||out - ref|| / ||ref||; infinite when `out` holds a NaN.
pub fn rel_err(out: &[f32], reference: &[f32]) -> f64 {
    let (mut d, mut r) = (0.0f64, 0.0f64);
    for (o, x) in out.iter().zip(reference) {
        if o.is_nan() {
            return f64::INFINITY;
        }
        d += ((*o - *x) as f64).powi(2);
        r += (*x as f64).powi(2);
    }
    (d / r.max(1e-30)).sqrt()
}
