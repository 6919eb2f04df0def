//! Model presets: a transformer block expanded into its tensor-parallel
//! linear layers, each one [`Scenario`] of ficco's operators.
//!
//! The shape rules are those of `suites/llama3.toml` (a unit test checks that
//! every scenario of that suite is reproduced). For T tokens on P GPUs, with
//! hidden size h, FFN size f, and kv = kv_heads x head_dim (the query
//! projection is h wide):
//!
//! | layer | op | m | k | n |
//! |---|---|---|---|---|
//! | `qkv` | ag-gemm | T | h | (h + 2 kv) / P |
//! | `attn_out` | gemm-rs | T | h / P | h |
//! | `mlp_up` | ag-gemm | T | h | 2 f / P (gate and up fused) |
//! | `mlp_down` | gemm-rs | T | f / P | h |
//! | `attn_out_ar` | gemm-ar | T | h / P | h (attention out without sequence parallelism) |
//!
//! Scenario names are `MODEL.LAYER.tT.pP`, e.g. `llama3-8b.qkv.t2048.p2`.
//!
//! ## Mixture of experts (`mixtral-8x7b`)
//!
//! The attention layers are those of a dense model. The expert MLP is
//! expanded as its *dense equivalent* under tensor parallelism of every
//! expert (no expert parallelism) and balanced routing: the tokens are
//! gathered once (T x h, as in a dense layer), each token goes through
//! `top_k` experts, so the up projection is an ag-gemm with
//! n = top_k x 2 f / P and the down projection a gemm-rs with
//! k = top_k x f / P. The down projection is exact as a single GEMM (the
//! router-weighted sum over a token's experts is a sum over K); the up
//! projection has the right communication volume and FLOPs but in reality
//! multiplies each token by different experts' weights. Routing imbalance and
//! expert parallelism (`a2a-gemm`) are not modelled here.

use crate::error::{Error, Result};
use crate::problem::workload::{Op, Problem, Scenario};
use serde::{Deserialize, Serialize};

/// The sizes of a model that decide its tensor-parallel GEMM shapes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelSpec {
    /// Name used as the scenario prefix.
    pub name: String,
    /// Hidden size h (= query heads x head dim).
    pub hidden: usize,
    /// FFN (intermediate) size f of one MLP (one expert for MoE).
    pub ffn: usize,
    /// Key/value width: kv heads x head dim.
    pub kv: usize,
    /// Experts per MLP (1 for dense models).
    pub experts: usize,
    /// Experts each token is routed to (1 for dense models).
    pub top_k: usize,
}

/// One tensor-parallel linear layer of a transformer block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Layer {
    /// Fused Q, K, V projection (column-parallel, sequence-parallel input).
    Qkv,
    /// Attention output projection (row-parallel, reduce-scatter).
    AttnOut,
    /// Fused gate and up projection of the MLP (column-parallel).
    MlpUp,
    /// MLP down projection (row-parallel, reduce-scatter).
    MlpDown,
    /// Attention output projection without sequence parallelism (all-reduce).
    AttnOutAr,
}

impl Layer {
    /// In the order of a block (and of `suites/llama3.toml`).
    pub const ALL: [Layer; 5] = [
        Layer::Qkv,
        Layer::AttnOut,
        Layer::MlpUp,
        Layer::MlpDown,
        Layer::AttnOutAr,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Layer::Qkv => "qkv",
            Layer::AttnOut => "attn_out",
            Layer::MlpUp => "mlp_up",
            Layer::MlpDown => "mlp_down",
            Layer::AttnOutAr => "attn_out_ar",
        }
    }

    pub fn op(self) -> Op {
        match self {
            Layer::Qkv | Layer::MlpUp => Op::AgGemm,
            Layer::AttnOut | Layer::MlpDown => Op::GemmRs,
            Layer::AttnOutAr => Op::GemmAr,
        }
    }
}

/// (name, hidden, ffn, kv, experts, top_k) of the built-in presets.
const PRESETS: [(&str, usize, usize, usize, usize, usize); 4] = [
    // 32 q heads x 128, 8 kv heads x 128.
    ("llama3-8b", 4096, 14336, 1024, 1, 1),
    // 64 q heads x 128, 8 kv heads x 128.
    ("llama3-70b", 8192, 28672, 1024, 1, 1),
    // 128 q heads x 128, 8 kv heads x 128.
    ("llama3-405b", 16384, 53248, 1024, 1, 1),
    // 32 q heads x 128, 8 kv heads x 128; 8 experts, top-2.
    ("mixtral-8x7b", 4096, 14336, 1024, 8, 2),
];

/// Names of the built-in presets.
pub fn preset_names() -> Vec<&'static str> {
    PRESETS.iter().map(|p| p.0).collect()
}

/// A built-in preset by name.
pub fn preset(name: &str) -> Result<ModelSpec> {
    PRESETS
        .iter()
        .find(|p| p.0 == name)
        .map(|&(name, hidden, ffn, kv, experts, top_k)| ModelSpec {
            name: name.to_string(),
            hidden,
            ffn,
            kv,
            experts,
            top_k,
        })
        .ok_or_else(|| Error::UnknownModel {
            name: name.to_string(),
            known: format!("{}, or custom sizes", preset_names().join(", ")),
        })
}

impl ModelSpec {
    /// A dense model from its sizes, named `custom-hH-fF-kvKV` unless `name` is given.
    pub fn custom(name: Option<&str>, hidden: usize, ffn: usize, kv: usize) -> Result<Self> {
        for (what, v) in [("hidden", hidden), ("ffn", ffn), ("kv", kv)] {
            if v == 0 {
                return Err(Error::Shape(format!("model {what} size must be positive")));
            }
        }
        if kv > hidden {
            return Err(Error::Shape(format!(
                "kv width {kv} is larger than the hidden size {hidden}"
            )));
        }
        Ok(ModelSpec {
            name: name
                .map(str::to_string)
                .unwrap_or_else(|| format!("custom-h{hidden}-f{ffn}-kv{kv}")),
            hidden,
            ffn,
            kv,
            experts: 1,
            top_k: 1,
        })
    }

    /// The problem of one layer for `tokens` tokens on `gpus` GPUs.
    pub fn problem(&self, layer: Layer, tokens: usize, gpus: usize) -> Result<Problem> {
        if gpus == 0 {
            return Err(Error::Shape("gpus must be positive".into()));
        }
        let div = |what: &str, v: usize| -> Result<usize> {
            if v % gpus != 0 {
                Err(Error::Shape(format!(
                    "{}.{}: {what} = {v} is not divisible by the GPU count {gpus}",
                    self.name,
                    layer.name()
                )))
            } else {
                Ok(v / gpus)
            }
        };
        let (h, f, e) = (self.hidden, self.ffn, self.top_k);
        let (k, n) = match layer {
            Layer::Qkv => (h, div("h + 2 kv", h + 2 * self.kv)?),
            Layer::AttnOut | Layer::AttnOutAr => (div("h", h)?, h),
            Layer::MlpUp => (h, div("top_k x 2 f", e * 2 * f)?),
            Layer::MlpDown => (div("top_k x f", e * f)?, h),
        };
        Problem::new(layer.op(), tokens, k, n, gpus)
    }

    /// The name of one layer's scenario, e.g. `llama3-8b.qkv.t2048.p2`.
    pub fn scenario_name(&self, layer: Layer, tokens: usize, gpus: usize) -> String {
        format!("{}.{}.t{tokens}.p{gpus}", self.name, layer.name())
    }

    /// Every layer of a block, in block order.
    pub fn scenarios(&self, tokens: usize, gpus: usize) -> Result<Vec<Scenario>> {
        Layer::ALL
            .iter()
            .map(|&layer| {
                Ok(Scenario {
                    name: self.scenario_name(layer, tokens, gpus),
                    problem: self.problem(layer, tokens, gpus)?,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SUITE: &str = include_str!("../../../../suites/llama3.toml");

    #[test]
    fn presets_reproduce_every_suite_scenario() {
        let suite = crate::problem::suite::parse(SUITE, "suites/llama3.toml").unwrap();
        assert_eq!(suite.scenarios.len(), 60);
        for sc in &suite.scenarios {
            // MODEL.LAYER.tT.pP
            let parts: Vec<&str> = sc.name.split('.').collect();
            assert_eq!(parts.len(), 4, "{}", sc.name);
            let model = preset(parts[0]).unwrap();
            let tokens: usize = parts[2][1..].parse().unwrap();
            let gpus: usize = parts[3][1..].parse().unwrap();
            let expanded = model.scenarios(tokens, gpus).unwrap();
            let found = expanded
                .iter()
                .find(|e| e.name == sc.name)
                .unwrap_or_else(|| panic!("{} not in the preset expansion", sc.name));
            assert_eq!(found, sc, "{}", sc.name);
        }
    }

    #[test]
    fn every_preset_expands_at_suite_sizes() {
        for name in preset_names() {
            let m = preset(name).unwrap();
            for gpus in [2, 4, 8] {
                let s = m.scenarios(4096, gpus).unwrap();
                assert_eq!(s.len(), 5);
                assert!(s[0].name.starts_with(name));
            }
        }
    }

    #[test]
    fn mixtral_is_the_dense_equivalent_of_top2() {
        let m = preset("mixtral-8x7b").unwrap();
        let up = m.problem(Layer::MlpUp, 2048, 2).unwrap();
        assert_eq!((up.m, up.k, up.n), (2048, 4096, 2 * 2 * 14336 / 2));
        let down = m.problem(Layer::MlpDown, 2048, 2).unwrap();
        assert_eq!((down.m, down.k, down.n), (2048, 2 * 14336 / 2, 4096));
        // Attention is as in a dense model of the same sizes.
        let dense = ModelSpec::custom(None, 4096, 14336, 1024).unwrap();
        assert_eq!(
            m.problem(Layer::Qkv, 2048, 2).unwrap(),
            dense.problem(Layer::Qkv, 2048, 2).unwrap()
        );
    }

    #[test]
    fn custom_models_and_errors() {
        let c = ModelSpec::custom(None, 4096, 14336, 1024).unwrap();
        assert_eq!(
            c.scenarios(2048, 2).unwrap(),
            preset("llama3-8b")
                .unwrap()
                .scenarios(2048, 2)
                .unwrap()
                .into_iter()
                .map(|s| Scenario {
                    name: s.name.replace("llama3-8b", "custom-h4096-f14336-kv1024"),
                    ..s
                })
                .collect::<Vec<_>>()
        );
        let err = preset("gpt5").unwrap_err();
        assert!(err.to_string().contains("gpt5") && err.to_string().contains("llama3-8b"));
        assert!(ModelSpec::custom(None, 0, 1, 1).is_err());
        let odd = ModelSpec::custom(None, 4096, 14335, 1024).unwrap();
        let err = odd.problem(Layer::MlpDown, 2048, 2).unwrap_err();
        assert!(err.to_string().contains("not divisible"), "{err}");
        // Tokens fewer than GPUs: the problem check names it.
        let err = c.problem(Layer::Qkv, 2, 4).unwrap_err();
        assert!(
            err.to_string().contains("smaller than the GPU count"),
            "{err}"
        );
    }
}
