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
//! ## Mixture of experts
//!
//! A preset with experts (`experts` > 1) also expands its expert MLP under
//! expert parallelism, with a real routing ([`crate::problem::routing`]):
//!
//! | layer | op | tokens | k | n |
//! |---|---|---|---|---|
//! | `moe_up` | a2a-gemm | T | h | 2 f (gate and up fused, per expert) |
//! | `moe_down` | gemm-a2a | T | f | h |
//!
//! named `MODEL.LAYER.tT.pP.SKEW` (SKEW is `none`, `moderate`, `heavy` or
//! `skewX` for a Zipf exponent X), e.g. `mixtral-8x7b.moe_up.t8192.p4.none`.
//! They need the GPU count to divide the experts (E/P experts per GPU);
//! where it does not, the MoE layers are left out ([`ModelSpec::moe_misfit`]
//! says why).
//!
//! For `mixtral-8x7b` the tensor-parallel layers are kept too, the expert
//! MLP there as its *dense equivalent* under tensor parallelism of every
//! expert (no expert parallelism) and balanced routing: the tokens are
//! gathered once (T x h, as in a dense layer), each token goes through
//! `top_k` experts, so the up projection is an ag-gemm with
//! n = top_k x 2 f / P and the down projection a gemm-rs with
//! k = top_k x f / P. The down projection is exact as a single GEMM (the
//! router-weighted sum over a token's experts is a sum over K); the up
//! projection has the right communication volume and FLOPs but in reality
//! multiplies each token by different experts' weights. Side by side with
//! `moe_up`/`moe_down` they compare TP and EP for the same expert MLP.
//!
//! `qwen3-30b-a3b` and `deepseek-v2-lite` expand only their expert layers:
//! Qwen3's query projection (32 heads x 128 = 4096) is wider than its hidden
//! size (2048) and DeepSeek-V2 uses multi-head latent attention, neither of
//! which the tensor-parallel rules above describe; every Qwen3-30B-A3B
//! layer is MoE, and DeepSeek-V2-Lite's first (dense) layer and its 2
//! shared experts are not modelled.

use crate::error::{Error, Result};
use crate::problem::routing::{MoeSpec, Skew, DEFAULT_SEED};
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
    /// Whether the tensor-parallel layers ([`Layer::ALL`]) describe the
    /// model (standard attention with a query projection h wide).
    #[serde(default = "yes")]
    pub tp_layers: bool,
}

fn yes() -> bool {
    true
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
    /// Expert up projection (gate and up fused) after the dispatch all-to-all.
    MoeUp,
    /// Expert down projection before the combine all-to-all.
    MoeDown,
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

    /// The expert-parallel layers of a mixture-of-experts block.
    pub const MOE: [Layer; 2] = [Layer::MoeUp, Layer::MoeDown];

    pub fn name(self) -> &'static str {
        match self {
            Layer::Qkv => "qkv",
            Layer::AttnOut => "attn_out",
            Layer::MlpUp => "mlp_up",
            Layer::MlpDown => "mlp_down",
            Layer::AttnOutAr => "attn_out_ar",
            Layer::MoeUp => "moe_up",
            Layer::MoeDown => "moe_down",
        }
    }

    pub fn op(self) -> Op {
        match self {
            Layer::Qkv | Layer::MlpUp => Op::AgGemm,
            Layer::AttnOut | Layer::MlpDown => Op::GemmRs,
            Layer::AttnOutAr => Op::GemmAr,
            Layer::MoeUp => Op::A2aGemm,
            Layer::MoeDown => Op::GemmA2a,
        }
    }
}

/// (name, hidden, ffn, kv, experts, top_k, tp_layers) of the built-in
/// presets; ffn is one expert's for MoE models. Sources: the models'
/// Hugging Face `config.json`.
const PRESETS: [(&str, usize, usize, usize, usize, usize, bool); 6] = [
    // 32 q heads x 128, 8 kv heads x 128.
    ("llama3-8b", 4096, 14336, 1024, 1, 1, true),
    // 64 q heads x 128, 8 kv heads x 128.
    ("llama3-70b", 8192, 28672, 1024, 1, 1, true),
    // 128 q heads x 128, 8 kv heads x 128.
    ("llama3-405b", 16384, 53248, 1024, 1, 1, true),
    // mistralai/Mixtral-8x7B-v0.1: hidden_size 4096, intermediate_size
    // 14336, num_local_experts 8, num_experts_per_tok 2; 32 q heads x 128,
    // 8 kv heads x 128.
    ("mixtral-8x7b", 4096, 14336, 1024, 8, 2, true),
    // Qwen/Qwen3-30B-A3B: hidden_size 2048, moe_intermediate_size 768,
    // num_experts 128, num_experts_per_tok 8; 4 kv heads x 128 (attention
    // not expanded, see the module doc).
    ("qwen3-30b-a3b", 2048, 768, 512, 128, 8, false),
    // deepseek-ai/DeepSeek-V2-Lite: hidden_size 2048, moe_intermediate_size
    // 1408, n_routed_experts 64, num_experts_per_tok 6 (MLA attention, kv
    // latent 512, not expanded).
    ("deepseek-v2-lite", 2048, 1408, 512, 64, 6, false),
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
        .map(
            |&(name, hidden, ffn, kv, experts, top_k, tp_layers)| ModelSpec {
                name: name.to_string(),
                hidden,
                ffn,
                kv,
                experts,
                top_k,
                tp_layers,
            },
        )
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
            tp_layers: true,
        })
    }

    /// The problem of one layer for `tokens` tokens on `gpus` GPUs (MoE
    /// layers with uniform popularity and the default seed).
    pub fn problem(&self, layer: Layer, tokens: usize, gpus: usize) -> Result<Problem> {
        self.problem_routed(layer, tokens, gpus, Skew::NONE, DEFAULT_SEED)
    }

    /// Why the MoE layers cannot run on `gpus` GPUs (`None` when they can,
    /// or the model has no experts to place).
    pub fn moe_misfit(&self, gpus: usize) -> Option<String> {
        (self.experts > 1 && (gpus == 0 || self.experts % gpus != 0)).then(|| {
            format!(
                "{}: {} experts cannot be spread evenly over {gpus} GPUs; its MoE layers are left out",
                self.name, self.experts
            )
        })
    }

    /// The problem of one layer; MoE layers routed with `skew` and `seed`.
    pub fn problem_routed(
        &self,
        layer: Layer,
        tokens: usize,
        gpus: usize,
        skew: Skew,
        seed: u64,
    ) -> Result<Problem> {
        if gpus == 0 {
            return Err(Error::Shape("gpus must be positive".into()));
        }
        if Layer::MOE.contains(&layer) {
            let (k, n) = match layer {
                Layer::MoeUp => (self.hidden, 2 * self.ffn),
                _ => (self.ffn, self.hidden),
            };
            let spec = MoeSpec::new(self.experts, self.top_k, skew, seed);
            return Problem::moe(layer.op(), tokens, k, n, gpus, spec)
                .map_err(|e| Error::Shape(format!("{}.{}: {e}", self.name, layer.name())));
        }
        let div = |what: &str, v: usize| -> Result<usize> {
            if v % gpus != 0 {
                Err(Error::Shape(format!(
                    "{}.{}: {what} = {v} is not divisible by the GPU count {gpus}{}",
                    self.name,
                    layer.name(),
                    crate::problem::workload::nearest_multiples(v, gpus)
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
            // Returned above.
            Layer::MoeUp | Layer::MoeDown => (h, h),
        };
        Problem::new(layer.op(), tokens, k, n, gpus)
    }

    /// The name of one layer's scenario, e.g. `llama3-8b.qkv.t2048.p2`.
    pub fn scenario_name(&self, layer: Layer, tokens: usize, gpus: usize) -> String {
        format!("{}.{}.t{tokens}.p{gpus}", self.name, layer.name())
    }

    /// The name of an MoE layer's scenario, e.g. `mixtral-8x7b.moe_up.t8192.p4.heavy`.
    pub fn moe_scenario_name(
        &self,
        layer: Layer,
        tokens: usize,
        gpus: usize,
        skew: Skew,
    ) -> String {
        let s = match skew {
            Skew::NONE | Skew::MODERATE | Skew::HEAVY => skew.name(),
            s => format!("skew{}", s.value()),
        };
        format!("{}.{s}", self.scenario_name(layer, tokens, gpus))
    }

    /// Every layer of a block, in block order (MoE layers with uniform
    /// popularity and the default seed).
    pub fn scenarios(&self, tokens: usize, gpus: usize) -> Result<Vec<Scenario>> {
        self.scenarios_routed(tokens, gpus, Skew::NONE, DEFAULT_SEED)
    }

    /// Every layer of a block: the tensor-parallel layers (where they
    /// describe the model), then the MoE layers routed with `skew` and
    /// `seed` (where the GPU count divides the experts).
    pub fn scenarios_routed(
        &self,
        tokens: usize,
        gpus: usize,
        skew: Skew,
        seed: u64,
    ) -> Result<Vec<Scenario>> {
        let mut out = vec![];
        if self.tp_layers {
            for layer in Layer::ALL {
                out.push(Scenario {
                    name: self.scenario_name(layer, tokens, gpus),
                    problem: self.problem(layer, tokens, gpus)?,
                });
            }
        }
        if self.experts > 1 && self.moe_misfit(gpus).is_none() {
            for layer in Layer::MOE {
                out.push(Scenario {
                    name: self.moe_scenario_name(layer, tokens, gpus, skew),
                    problem: self.problem_routed(layer, tokens, gpus, skew, seed)?,
                });
            }
        }
        if out.is_empty() {
            return Err(Error::Shape(
                self.moe_misfit(gpus)
                    .unwrap_or_else(|| format!("{}: no layer to expand", self.name)),
            ));
        }
        Ok(out)
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
                let want = if m.tp_layers { 5 } else { 0 } + if m.experts > 1 { 2 } else { 0 };
                assert_eq!(s.len(), want, "{name}");
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
    fn moe_presets_have_their_expert_dims() {
        let q = preset("qwen3-30b-a3b").unwrap();
        let s = q
            .scenarios_routed(4096, 4, Skew::HEAVY, 3)
            .unwrap()
            .into_iter()
            .map(|s| (s.name, s.problem))
            .collect::<Vec<_>>();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].0, "qwen3-30b-a3b.moe_up.t4096.p4.heavy");
        let (up, down) = (&s[0].1, &s[1].1);
        assert_eq!(
            (up.op, up.m, up.k, up.n),
            (Op::A2aGemm, 4096, 2048, 2 * 768)
        );
        assert_eq!((down.op, down.k, down.n), (Op::GemmA2a, 768, 2048));
        let spec = up.moe.unwrap();
        assert_eq!(
            (spec.experts, spec.top_k, spec.skew, spec.seed),
            (128, 8, Skew::HEAVY, 3)
        );
        let d = preset("deepseek-v2-lite").unwrap();
        let up = d
            .problem_routed(Layer::MoeUp, 2048, 2, Skew::NONE, 1)
            .unwrap();
        assert_eq!(
            (up.k, up.n, up.moe.unwrap().experts, up.moe.unwrap().top_k),
            (2048, 2816, 64, 6)
        );
        let m = preset("mixtral-8x7b").unwrap();
        let names: Vec<String> = m
            .scenarios_routed(8192, 4, Skew::from_f64(0.8).unwrap(), 1)
            .unwrap()
            .into_iter()
            .map(|s| s.name)
            .collect();
        assert_eq!(names.len(), 7);
        assert_eq!(names[5], "mixtral-8x7b.moe_up.t8192.p4.skew0.8");
        // 8 experts on 16 GPUs: the TP layers only, and the reason.
        assert_eq!(m.scenarios(8192, 16).unwrap().len(), 5);
        assert!(m.moe_misfit(16).unwrap().contains("8 experts"));
        assert!(m.moe_misfit(4).is_none());
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
