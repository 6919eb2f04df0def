//! "Did you mean": the known name closest to a mistyped one.

/// Edit distance (insertions, deletions, substitutions) between `a` and `b`.
pub fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let up = row[j + 1];
            row[j + 1] = (diag + usize::from(ca != *cb)).min(up + 1).min(row[j] + 1);
            diag = up;
        }
    }
    row[b.len()]
}

/// The candidate closest to `name` when it is close enough to be a typo of
/// it: at most 2 edits, and fewer than a third of the candidate's length.
pub fn closest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let name = name.to_ascii_lowercase();
    candidates
        .into_iter()
        .map(|c| (edit_distance(&name, c), c))
        .filter(|&(d, c)| d <= 2 && 3 * d < c.chars().count())
        .min_by_key(|&(d, _)| d)
        .map(|(_, c)| c)
}

/// `"; did you mean 'X'?"` for [`closest`], or nothing.
pub fn did_you_mean<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> String {
    closest(name, candidates)
        .map(|c| format!("; did you mean '{c}'?"))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances_and_typos() {
        assert_eq!(edit_distance("ag-gemm", "ag-gemm"), 0);
        assert_eq!(edit_distance("ag-gem", "ag-gemm"), 1);
        assert_eq!(edit_distance("ag-gemmm", "ag-gemm"), 1);
        assert_eq!(edit_distance("gemm-ag", "ag-gemm"), 6);
        let ops = ["ag-gemm", "gemm-rs", "gemm-ar", "concurrent"];
        assert_eq!(closest("ag-gem", ops), Some("ag-gemm"));
        assert_eq!(closest("GEMM-RS", ops), Some("gemm-rs"));
        assert_eq!(closest("moe-fused", ops), None);
        assert_eq!(closest("x", ["ab"]), None);
        assert_eq!(did_you_mean("gemm-rz", ops), "; did you mean 'gemm-rs'?");
        assert_eq!(did_you_mean("xyz", ops), "");
    }
}
