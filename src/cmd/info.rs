//! `ficco info`: the GPUs, their links and the CUDA libraries found.

use crate::output::print;
use anyhow::Result;
use clap::Args;

#[derive(Args, Debug)]
pub struct InfoArgs {
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
}

pub fn run(args: InfoArgs) -> Result<()> {
    let info = ficco_cuda::info();
    if args.json {
        print(&(serde_json::to_string_pretty(&info)? + "\n"))
    } else {
        print(&(without_empty_versions(&info.to_string()) + "\n"))
    }
}

/// The versions line lists "-" for every library that is not loaded; when
/// none is, say so instead of `driver -  NCCL -  cuBLASLt -  NVRTC -`.
fn without_empty_versions(text: &str) -> String {
    text.lines()
        .map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let all_missing = l.starts_with("driver ")
                && words.len() >= 2
                && words.len() % 2 == 0
                && words.chunks(2).all(|w| w[1] == "-");
            if all_missing {
                "versions: none (no CUDA library loaded)".to_string()
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    #[test]
    fn empty_versions_line_is_one_phrase() {
        let t =
            super::without_empty_versions("# libraries\ndriver -  NCCL -  cuBLASLt -  NVRTC -\nx");
        assert_eq!(t, "# libraries\nversions: none (no CUDA library loaded)\nx");
        let t = super::without_empty_versions("driver 13000  NCCL 22803");
        assert_eq!(t, "driver 13000  NCCL 22803");
    }
}
