//! Token routing of a mixture-of-experts layer under expert parallelism: who
//! sends how many rows to which expert, for `a2a-gemm` and `gemm-a2a`.
//!
//! # The model
//!
//! T tokens are spread evenly over P ranks (T/P each). E experts are placed
//! in blocks: rank q owns experts `q·E/P .. (q+1)·E/P` (E/P local experts).
//! Every token picks `top_k` distinct experts; each pick is one *routed row*
//! (the token's hidden vector, sent to the expert's rank). So every rank
//! sends exactly T/P · top_k rows, and receives whatever its experts were
//! picked for: per-peer and per-expert counts vary, and an expert may get
//! none.
//!
//! Expert popularity is Zipf-distributed with exponent `skew` ([`Skew`]):
//! the i-th most popular expert has weight 1/(i+1)^skew (skew 0 is uniform).
//! Which expert is the i-th most popular is a seeded permutation, so the hot
//! experts land on arbitrary ranks, as in a trained router. A token's top_k
//! picks are weighted draws without replacement (each draw renormalised over
//! the experts it has not picked yet). Counts depend only on (T, P, E,
//! top_k, skew, seed): the workload records those, so the simulator, the CPU
//! interpreter and the GPU run all see the same counts ([`route`] is a pure
//! function; a small splitmix64 generator makes it reproducible everywhere).
//!
//! # Row layouts (one rank's buffers)
//!
//! * **Send side** (rank r's routed rows): sorted by expert, so by owner rank,
//!   as a router's permutation leaves them: rows of expert e start at
//!   [`Routing::send_offset`]`(r, e)`; the rows for owner q are one
//!   contiguous block ([`Routing::send_block`]).
//! * **Receive side** (rank q's expert input): source-major, as
//!   `all_to_all_single` delivers them: the block from source r, then within
//!   it q's experts in order ([`Routing::recv_block`], [`Routing::segments`]).

use crate::error::{Error, Result};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// Zipf exponent of expert popularity, stored in thousandths so that a
/// problem stays `Eq + Hash` (0.001 is far below anything routing can show).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Skew(u32);

impl Skew {
    /// Uniform popularity.
    pub const NONE: Skew = Skew(0);
    /// Zipf 0.6: on 8 experts with top-2 the hottest expert gets about 1.8x
    /// its fair share of rows.
    pub const MODERATE: Skew = Skew(600);
    /// Zipf 1.2: on 8 experts with top-2 the hottest expert gets about 2.9x
    /// its fair share, the coldest a third.
    pub const HEAVY: Skew = Skew(1200);
    /// The largest exponent taken: beyond it every token picks the same
    /// top_k experts and the routing says nothing more.
    pub const MAX: f64 = 4.0;

    /// The exponent from a number in [0, [`Skew::MAX`]].
    pub fn from_f64(v: f64) -> Result<Skew> {
        if !v.is_finite() || !(0.0..=Skew::MAX).contains(&v) {
            return Err(Error::Shape(format!(
                "skew must be none, moderate, heavy or a Zipf exponent between 0 and {}, got {v}",
                Skew::MAX
            )));
        }
        Ok(Skew((v * 1000.0).round() as u32))
    }

    pub fn value(self) -> f64 {
        self.0 as f64 / 1000.0
    }

    /// `none`, `moderate`, `heavy`, or the exponent (e.g. `0.8`).
    pub fn name(self) -> String {
        match self {
            Skew::NONE => "none".into(),
            Skew::MODERATE => "moderate".into(),
            Skew::HEAVY => "heavy".into(),
            s => format!("{}", s.value()),
        }
    }
}

impl fmt::Display for Skew {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

impl FromStr for Skew {
    type Err = Error;
    fn from_str(s: &str) -> Result<Skew> {
        match s {
            "none" => Ok(Skew::NONE),
            "moderate" => Ok(Skew::MODERATE),
            "heavy" => Ok(Skew::HEAVY),
            _ => match s.parse::<f64>() {
                Ok(v) => Skew::from_f64(v),
                Err(_) => Err(Error::Shape(format!(
                    "skew must be none, moderate, heavy or a Zipf exponent between 0 and {}, got '{s}'",
                    Skew::MAX
                ))),
            },
        }
    }
}

/// JSON and TOML show a skew as its name (`"heavy"`) or exponent (`"0.8"`).
impl Serialize for Skew {
    fn serialize<S: Serializer>(&self, ser: S) -> std::result::Result<S::Ok, S::Error> {
        ser.serialize_str(&self.name())
    }
}

impl<'de> Deserialize<'de> for Skew {
    fn deserialize<D: Deserializer<'de>>(de: D) -> std::result::Result<Skew, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Name(String),
            Num(f64),
        }
        match Raw::deserialize(de)? {
            Raw::Name(s) => s.parse().map_err(serde::de::Error::custom),
            Raw::Num(v) => Skew::from_f64(v).map_err(serde::de::Error::custom),
        }
    }
}

/// The expert-parallel part of an `a2a-gemm` / `gemm-a2a` problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MoeSpec {
    /// Experts E over all ranks (a multiple of the GPU count).
    pub experts: usize,
    /// Experts per token (1..=E).
    pub top_k: usize,
    /// Zipf exponent of expert popularity.
    pub skew: Skew,
    /// Seed of the routing draw.
    pub seed: u64,
}

/// Seed of the routing when none is given.
pub const DEFAULT_SEED: u64 = 1;

/// The most experts ficco takes (DeepSeek-V3 has 256 routed experts; the
/// per-task group lists and the routing table grow with E).
pub const MAX_EXPERTS: usize = 1024;

impl MoeSpec {
    pub fn new(experts: usize, top_k: usize, skew: Skew, seed: u64) -> Self {
        MoeSpec {
            experts,
            top_k,
            skew,
            seed,
        }
    }

    /// Checks the spec against `gpus` ranks.
    pub fn validate(&self, gpus: usize) -> Result<()> {
        if self.experts == 0 || self.experts > MAX_EXPERTS {
            return Err(Error::Shape(format!(
                "experts must be between 1 and {MAX_EXPERTS}, got {}",
                self.experts
            )));
        }
        if self.top_k == 0 || self.top_k > self.experts {
            return Err(Error::Shape(format!(
                "top-k must be between 1 and the expert count {}, got {}",
                self.experts, self.top_k
            )));
        }
        if gpus == 0 || self.experts % gpus != 0 {
            return Err(Error::Shape(format!(
                "experts = {} is not a multiple of the GPU count {gpus}: expert parallelism places E/P experts on every GPU",
                self.experts
            )));
        }
        if self.skew.value() > Skew::MAX {
            return Err(Error::Shape(format!(
                "skew {} is above {}",
                self.skew.value(),
                Skew::MAX
            )));
        }
        Ok(())
    }
}

/// Rows routed from every source rank to every expert.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Routing {
    pub gpus: usize,
    pub experts: usize,
    /// `counts[r][e]`: rows source rank r sends to expert e.
    pub counts: Vec<Vec<usize>>,
}

/// splitmix64: small, fast and identical on every platform.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in 0..n (n > 0).
    fn below(&mut self, n: usize) -> usize {
        (self.unit() * n as f64) as usize % n
    }
}

/// Rejected draws after which a pick falls back to an exact draw over the
/// experts not yet picked (heavy skew with top_k close to E would otherwise
/// reject almost every draw).
const MAX_REJECTIONS: usize = 32;

/// Routes `tokens` tokens over `gpus` ranks (see the module doc). The
/// caller has validated the spec and that `gpus` divides `tokens`.
pub fn route(tokens: usize, gpus: usize, spec: &MoeSpec) -> Routing {
    let e = spec.experts;
    let mut rng = Rng(spec.seed ^ 0x6d6f_655f_726f_7574);
    // Popularity rank -> expert: a seeded Fisher-Yates shuffle.
    let mut by_rank: Vec<usize> = (0..e).collect();
    for i in (1..e).rev() {
        let j = rng.below(i + 1);
        by_rank.swap(i, j);
    }
    let s = spec.skew.value();
    let mut weight = vec![0.0; e];
    for (i, &x) in by_rank.iter().enumerate() {
        weight[x] = 1.0 / ((i + 1) as f64).powf(s);
    }
    let total: f64 = weight.iter().sum();
    // Cumulative distribution for draws with replacement.
    let mut cdf = Vec::with_capacity(e);
    let mut acc = 0.0;
    for w in &weight {
        acc += w / total;
        cdf.push(acc);
    }
    let per_rank = tokens / gpus;
    let mut counts = vec![vec![0usize; e]; gpus];
    let mut picked = vec![false; e];
    let mut chosen = Vec::with_capacity(spec.top_k);
    for row in counts.iter_mut() {
        for _ in 0..per_rank {
            chosen.clear();
            for _ in 0..spec.top_k {
                let x = draw(&mut rng, &cdf, &weight, &picked);
                picked[x] = true;
                chosen.push(x);
            }
            for &x in &chosen {
                picked[x] = false;
                row[x] += 1;
            }
        }
    }
    Routing {
        gpus,
        experts: e,
        counts,
    }
}

/// One weighted draw among the experts not `picked`: rejection from the full
/// distribution (exactly the renormalised one), then an exact scan.
fn draw(rng: &mut Rng, cdf: &[f64], weight: &[f64], picked: &[bool]) -> usize {
    let last = cdf.len() - 1;
    for _ in 0..MAX_REJECTIONS {
        let u = rng.unit();
        let x = cdf.partition_point(|&c| c <= u).min(last);
        if !picked[x] {
            return x;
        }
    }
    let left: f64 = (0..cdf.len())
        .filter(|&x| !picked[x])
        .map(|x| weight[x])
        .sum();
    let mut u = rng.unit() * left;
    let mut fallback = 0;
    for x in (0..cdf.len()).filter(|&x| !picked[x]) {
        fallback = x;
        if u < weight[x] {
            return x;
        }
        u -= weight[x];
    }
    // Rounding left u at the very end: the last free expert.
    fallback
}

impl Routing {
    /// Experts per rank, E/P.
    pub fn local_experts(&self) -> usize {
        self.experts / self.gpus
    }

    /// The rank that owns expert `e`.
    pub fn owner(&self, e: usize) -> usize {
        e / self.local_experts()
    }

    /// Experts of rank q.
    pub fn experts_of(&self, q: usize) -> std::ops::Range<usize> {
        let l = self.local_experts();
        q * l..(q + 1) * l
    }

    /// Rows rank r sends in all (its routed rows, T/P · top_k).
    pub fn sent(&self, r: usize) -> usize {
        self.counts[r].iter().sum()
    }

    /// First row of expert e in rank r's send-side (expert-sorted) rows.
    pub fn send_offset(&self, r: usize, e: usize) -> usize {
        self.counts[r][..e].iter().sum()
    }

    /// Rows rank r sends to rank q's experts.
    pub fn pair(&self, r: usize, q: usize) -> usize {
        self.experts_of(q).map(|e| self.counts[r][e]).sum()
    }

    /// (first row, rows) of the block rank r sends to rank q, in r's send-side rows.
    pub fn send_block(&self, r: usize, q: usize) -> (usize, usize) {
        let first = self.experts_of(q).start;
        (self.send_offset(r, first), self.pair(r, q))
    }

    /// Rows rank q receives in all (own source included).
    pub fn received(&self, q: usize) -> usize {
        (0..self.gpus).map(|r| self.pair(r, q)).sum()
    }

    /// (first row, rows) of the block from source r in rank q's receive-side rows.
    pub fn recv_block(&self, q: usize, r: usize) -> (usize, usize) {
        let first = (0..r).map(|x| self.pair(x, q)).sum();
        (first, self.pair(r, q))
    }

    /// The expert segments of the block rank r sends to rank q, as
    /// (local expert index, offset within the block, rows), empty ones left out.
    pub fn segments(&self, r: usize, q: usize) -> Vec<(usize, usize, usize)> {
        let mut at = 0;
        let mut out = vec![];
        for (l, e) in self.experts_of(q).enumerate() {
            let n = self.counts[r][e];
            if n > 0 {
                out.push((l, at, n));
            }
            at += n;
        }
        out
    }

    /// Rows expert e receives from all sources.
    pub fn expert_load(&self, e: usize) -> usize {
        self.counts.iter().map(|row| row[e]).sum()
    }

    /// One line for reports: rows per rank, load spread and empty experts.
    pub fn summary(&self) -> String {
        let recv: Vec<String> = (0..self.gpus)
            .map(|q| self.received(q).to_string())
            .collect();
        let loads: Vec<usize> = (0..self.experts).map(|e| self.expert_load(e)).collect();
        let mean = loads.iter().sum::<usize>() as f64 / self.experts.max(1) as f64;
        let max = loads.iter().copied().max().unwrap_or(0);
        let empty = loads.iter().filter(|&&l| l == 0).count();
        format!(
            "rows received per rank {}; hottest expert {max} rows ({:.2}x the mean); {empty} of {} experts empty",
            recv.join("/"),
            if mean > 0.0 { max as f64 / mean } else { 0.0 },
            self.experts
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(e: usize, k: usize, skew: Skew, seed: u64) -> MoeSpec {
        MoeSpec::new(e, k, skew, seed)
    }

    #[test]
    fn every_token_picks_top_k_distinct_experts() {
        for (e, k) in [(8, 2), (8, 8), (64, 6), (4, 1)] {
            for skew in [Skew::NONE, Skew::HEAVY, Skew::from_f64(4.0).unwrap()] {
                let r = route(64, 4, &spec(e, k, skew, 3));
                for q in 0..4 {
                    assert_eq!(r.sent(q), 16 * k);
                    // A token picks an expert at most once.
                    assert!(r.counts[q].iter().all(|&c| c <= 16));
                }
                if k == e {
                    assert!(r.counts.iter().flatten().all(|&c| c == 16));
                }
            }
        }
    }

    #[test]
    fn seeded_and_reproducible() {
        let s = spec(8, 2, Skew::MODERATE, 42);
        assert_eq!(route(4096, 4, &s), route(4096, 4, &s));
        assert_ne!(
            route(4096, 4, &s),
            route(4096, 4, &MoeSpec { seed: 43, ..s })
        );
    }

    /// Pinned loads: the routing must not drift between versions, and
    /// `bench/anchor.py`'s Python port (`_moe_routing`) gives these same
    /// counts for (256 tokens, 4 ranks, 8 experts, top-3, heavy, seed 5).
    #[test]
    fn pinned_counts_shared_with_the_python_anchor() {
        let r = route(256, 4, &spec(8, 3, Skew::HEAVY, 5));
        let loads: Vec<usize> = (0..8).map(|e| r.expert_load(e)).collect();
        assert_eq!(loads, [121, 213, 51, 158, 48, 34, 81, 62]);
        // The exact-scan fallback (skew 4, top-12 of 16).
        let r = route(64, 2, &spec(16, 12, Skew::from_f64(4.0).unwrap(), 2));
        let loads: Vec<usize> = (0..16).map(|e| r.expert_load(e)).collect();
        assert_eq!(
            loads,
            [52, 13, 13, 64, 64, 64, 64, 29, 15, 64, 64, 35, 59, 45, 59, 64]
        );
    }

    #[test]
    fn skew_concentrates_load() {
        let spread = |skew| {
            let r = route(16384, 4, &spec(8, 2, skew, 7));
            let loads: Vec<usize> = (0..8).map(|e| r.expert_load(e)).collect();
            *loads.iter().max().unwrap() as f64 / (16384.0 * 2.0 / 8.0)
        };
        let (none, moderate, heavy) = (
            spread(Skew::NONE),
            spread(Skew::MODERATE),
            spread(Skew::HEAVY),
        );
        // Uniform: sampling noise only. Documented factors: ~1.8x, ~2.9x.
        assert!(none < 1.05, "{none}");
        assert!((1.5..2.1).contains(&moderate), "{moderate}");
        assert!((2.5..3.2).contains(&heavy), "{heavy}");
    }

    #[test]
    fn heavy_skew_with_few_tokens_leaves_experts_empty() {
        let r = route(16, 2, &spec(64, 2, Skew::HEAVY, 1));
        assert!((0..64).any(|e| r.expert_load(e) == 0));
        assert_eq!(r.received(0) + r.received(1), 32);
    }

    #[test]
    fn layouts_add_up() {
        let r = route(256, 4, &spec(8, 3, Skew::HEAVY, 5));
        for q in 0..4 {
            let mut at = 0;
            for src in 0..4 {
                let (first, rows) = r.recv_block(q, src);
                assert_eq!(first, at);
                at += rows;
                let segs: usize = r.segments(src, q).iter().map(|s| s.2).sum();
                assert_eq!(segs, rows);
                let (sf, sr) = r.send_block(src, q);
                assert_eq!(sr, rows);
                assert_eq!(sf, r.send_offset(src, 2 * q));
            }
            assert_eq!(at, r.received(q));
        }
        assert!(r.summary().contains("experts empty"));
    }

    #[test]
    fn skew_names_and_errors() {
        assert_eq!("heavy".parse::<Skew>().unwrap(), Skew::HEAVY);
        assert_eq!("0.6".parse::<Skew>().unwrap(), Skew::MODERATE);
        assert_eq!("0.8".parse::<Skew>().unwrap().name(), "0.8");
        for bad in ["-1", "5", "lots", "NaN"] {
            let e = bad.parse::<Skew>().unwrap_err().to_string();
            assert!(e.contains("skew must be"), "{bad}: {e}");
        }
        let j = serde_json::to_string(&Skew::HEAVY).unwrap();
        assert_eq!(j, "\"heavy\"");
        assert_eq!(serde_json::from_str::<Skew>("0.6").unwrap(), Skew::MODERATE);
        assert!(spec(8, 9, Skew::NONE, 1).validate(2).is_err());
        assert!(spec(6, 2, Skew::NONE, 1).validate(4).is_err());
        assert!(spec(8, 2, Skew::NONE, 1).validate(4).is_ok());
    }
}
