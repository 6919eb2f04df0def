//! CUDA libraries that are present but unusable, end to end: fake libraries
//! (compiled here with the system C compiler) are put first on the loader's
//! search path (`LD_LIBRARY_PATH`), and `ficco info`, `explore` (auto and
//! gpu), `tune`, `characterize` and `gemm-bench` are run against them.
//! `info` must name the library, the file and what is wrong; `auto` must
//! fall back to the simulator saying why; the commands that need GPUs must
//! fail on one line naming the library; nothing may panic or hang. Needs no
//! GPU, but a C compiler: without one each test fails, saying so.
//!
//! Each fake takes cudarc's first candidate name for its library
//! (`libcuda.so`, `libcublasLt.so`, ...), so it is found before any real
//! library the machine has, with or without a GPU.

use ficco_testkit::fakelib;
mod support;

use ficco_cuda::loader::{LibSpec, CUBLASLT, CUDA, NCCL, NVRTC};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use support::{stderr, stdout};

const SHAPE: [&str; 10] = [
    "--op", "ag-gemm", "--m", "1024", "--k", "256", "--n", "256", "--gpus", "2",
];

/// The C compiler; fails `test` without one.
fn cc(test: &str) -> String {
    fakelib::compiler_for(test)
}

/// Runs `ficco args` with only `libs` on `LD_LIBRARY_PATH`; fails the test
/// if it runs for more than a minute (a hang), killing it first.
fn ficco_with(libs: &Path, args: &[&str]) -> Output {
    let out = libs.join(format!("out-{}.txt", args.join("_").replace('/', "_")));
    let err = out.with_extension("err");
    let file = |p: &PathBuf| Stdio::from(std::fs::File::create(p).expect("create output file"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_ficco"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("LD_LIBRARY_PATH", libs)
        .env_remove("FICCO_NCCL_SHIM")
        .stdin(Stdio::null())
        .stdout(file(&out))
        .stderr(file(&err))
        .spawn()
        .expect("run ficco");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for ficco") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("ficco {args:?} still running after 60 s (a hang)");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: std::fs::read(&out).expect("read stdout"),
        stderr: std::fs::read(&err).expect("read stderr"),
    }
}

/// No panic, no internal error, no `Error:` prefix.
fn assert_clean(args: &[&str], o: &Output) {
    let err = stderr(o);
    for bad in [
        "panicked",
        "internal error",
        "backtrace",
        "Error:",
        "Missing symbol",
    ] {
        assert!(!err.contains(bad), "{args:?}: {bad}: {err}");
    }
}

/// Exit 2 and exactly one `error:` line, containing every one of `want`.
fn assert_error(o: &Output, args: &[&str], want: &[&str]) -> String {
    assert_clean(args, o);
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(lines.len(), 1, "{args:?}: one error line expected:\n{err}");
    for w in want {
        assert!(lines[0].contains(w), "{args:?}: no '{w}' in {}", lines[0]);
    }
    lines[0].to_string()
}

/// `explore --backend auto` simulates and says why on one stderr line,
/// which contains every one of `want`.
fn assert_falls_back(libs: &Path, want: &[&str]) {
    let args = [&["explore"], &SHAPE[..]].concat();
    let o = ficco_with(libs, &args);
    assert_clean(&args, &o);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].starts_with("ficco: no GPU backend available (")
            && lines[0].ends_with("); simulating with hardware profile 'h200-nvlink'"),
        "{err}"
    );
    for w in want {
        assert!(lines[0].contains(w), "no '{w}' in {err}");
    }
    let out = stdout(&o);
    assert!(
        out.starts_with("# ficco explore") && out.contains("# best: "),
        "{out}"
    );
}

/// `explore --backend gpu` fails on one line containing every one of `want`.
fn assert_gpu_fails(libs: &Path, want: &[&str]) -> String {
    let args = [&["explore", "--backend", "gpu"], &SHAPE[..]].concat();
    let o = ficco_with(libs, &args);
    assert_error(&o, &args, want)
}

/// `ficco info` exits 0; returns its stdout.
fn info(libs: &Path) -> String {
    let o = ficco_with(libs, &["info"]);
    assert_clean(&["info"], &o);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).is_empty(), "{}", stderr(&o));
    stdout(&o)
}

/// The line of `info`'s library table for `name`.
fn row<'a>(info: &'a str, name: &str) -> &'a str {
    info.lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no {name} row in:\n{info}"))
}

fn real(p: &Path) -> String {
    std::fs::canonicalize(p)
        .expect("the fake exists")
        .display()
        .to_string()
}

/// cudarc's first file name for `spec`: found before any other.
fn first_name(spec: &LibSpec) -> String {
    ficco_cuda::loader::candidates(spec.stems)[0].clone()
}

/// Complete fakes of all four libraries (supported versions; `cuInit`
/// answers `CUDA_ERROR_NO_DEVICE` unless `cu_init` says otherwise).
fn all_four(cc: &str, dir: &Path, cu_init: Option<&str>) {
    for spec in [&CUDA, &CUBLASLT, &NCCL, &NVRTC] {
        let bodies: Vec<(&str, &str)> = match (std::ptr::eq(spec, &CUDA), cu_init) {
            (true, Some(b)) => vec![("cuInit", b)],
            _ => vec![],
        };
        fakelib::fake(cc, dir, &first_name(spec), spec, &[], &bodies);
    }
}

#[test]
fn a_driver_without_cuinit_is_named_and_auto_simulates() {
    let test = "a_driver_without_cuinit_is_named_and_auto_simulates";
    let cc = cc(test);
    let dir = fakelib::folder(test);
    // The driver's usual name, and cudarc's first one linked to it.
    let lib = fakelib::build(
        &cc,
        &dir,
        "libcuda.so.1",
        "int cuNothing(void) { return 0; }\n",
        &[],
    );
    std::os::unix::fs::symlink(&lib, dir.join("libcuda.so")).expect("link");
    let path = real(&lib);
    let why = format!("{path} has no symbol cuInit, nor");

    let text = info(&dir);
    let r = row(&text, "libcuda");
    assert!(r.contains("UNUSABLE") && r.contains(&why), "{text}");
    assert!(
        text.contains(&format!(
            "# no GPUs: libcuda (the CUDA driver) unusable: {why}"
        )),
        "{text}"
    );

    let o = ficco_with(&dir, &["info", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("info --json");
    let cuda = &v["libraries"]["cuda"];
    assert_eq!(cuda["found"], true);
    assert_eq!(cuda["usable"], false);
    assert_eq!(cuda["path"], path.as_str());
    assert_eq!(cuda["problem"]["kind"], "missing_symbols");
    assert_eq!(cuda["problem"]["missing"][0], "cuInit");

    assert_falls_back(&dir, &["libcuda (the CUDA driver) unusable", &why]);
    assert_gpu_fails(
        &dir,
        &[
            "GPU backend not available: libcuda (the CUDA driver) unusable",
            &why,
        ],
    );
    let cache = dir.join("tune.json").display().to_string();
    let args = [&["tune", "--cache", cache.as_str()], &SHAPE[..]].concat();
    assert_error(
        &ficco_with(&dir, &args),
        &args,
        &["none is usable", "cuInit", &path],
    );
    let args = ["characterize", "--gpus", "2", "--quick"];
    assert_error(&ficco_with(&dir, &args), &args, &["cuInit", &path]);
    let args = ["gemm-bench", "--max-shapes", "1"];
    assert_error(
        &ficco_with(&dir, &args),
        &args,
        &[
            "gemm-bench needs a GPU: libcuda (the CUDA driver) unusable",
            &path,
        ],
    );
}

#[test]
fn an_old_driver_is_named_with_its_version() {
    let test = "an_old_driver_is_named_with_its_version";
    let cc = cc(test);
    let dir = fakelib::folder(test);
    all_four(&cc, &dir, None);
    let lib = fakelib::fake(
        &cc,
        &dir,
        "libcuda.so",
        &CUDA,
        &[],
        &[(
            "cuDriverGetVersion",
            "int cuDriverGetVersion(int *v) { *v = 12020; return 0; }",
        )],
    );
    let why = format!(
        "{} is version 12.2; ficco needs a driver for CUDA 13.0 or newer",
        real(&lib)
    );
    let text = info(&dir);
    assert!(row(&text, "libcuda").contains(&why), "{text}");
    assert!(row(&text, "cuBLASLt").contains("ok"), "{text}");
    assert_falls_back(&dir, &[&why]);
    assert_gpu_fails(&dir, &[&why]);
}

#[test]
fn a_wrong_cublaslt_major_is_named_with_its_version() {
    let test = "a_wrong_cublaslt_major_is_named_with_its_version";
    let cc = cc(test);
    let dir = fakelib::folder(test);
    all_four(&cc, &dir, None);
    let lib = fakelib::fake(
        &cc,
        &dir,
        "libcublasLt.so",
        &CUBLASLT,
        &[],
        &[(
            "cublasLtGetVersion",
            "unsigned long cublasLtGetVersion(void) { return 120903; }",
        )],
    );
    let why = format!(
        "{} is version 12.9.3; ficco needs major version 13",
        real(&lib)
    );
    let text = info(&dir);
    let r = row(&text, "cuBLASLt");
    assert!(r.contains("UNUSABLE") && r.contains(&why), "{text}");
    assert_falls_back(&dir, &["cuBLASLt unusable", &why]);
    assert_gpu_fails(&dir, &["cuBLASLt unusable", &why]);
}

#[test]
fn a_driver_with_no_device_falls_back() {
    let test = "a_driver_with_no_device_falls_back";
    let cc = cc(test);
    let dir = fakelib::folder(test);
    all_four(&cc, &dir, None);
    let text = info(&dir);
    for name in ["libcuda", "cuBLASLt", "NCCL", "NVRTC"] {
        let r = row(&text, name);
        assert!(
            r.contains(" ok ") && r.contains(&dir.display().to_string()),
            "{text}"
        );
    }
    assert!(row(&text, "libcuda").contains("13.0"), "{text}");
    assert!(row(&text, "cuBLASLt").contains("13.1.0"), "{text}");
    assert!(row(&text, "NCCL").contains("2.28.3"), "{text}");
    let no_device = "no CUDA GPU found: cuInit: CUDA_ERROR_NO_DEVICE";
    assert!(text.contains(&format!("# no GPUs: {no_device}")), "{text}");
    assert!(!text.contains("--verbose"), "{text}");
    assert_falls_back(&dir, &[no_device]);
    assert_gpu_fails(&dir, &[no_device]);
}

#[test]
fn a_driver_that_cannot_start_falls_back_with_the_reason() {
    let test = "a_driver_that_cannot_start_falls_back_with_the_reason";
    let cc = cc(test);
    let dir = fakelib::folder(test);
    // CUDA_ERROR_SYSTEM_DRIVER_MISMATCH: libcuda and the kernel module differ.
    all_four(
        &cc,
        &dir,
        Some("int cuInit(unsigned f) { (void)f; return 803; }"),
    );
    let why = "the CUDA driver cannot start: cuInit returned CUDA_ERROR_SYSTEM_DRIVER_MISMATCH \
               (libcuda does not match the loaded kernel driver";
    assert!(info(&dir).contains(&format!("# no GPUs: {why}")));
    assert_falls_back(&dir, &[why]);
    assert_gpu_fails(&dir, &[why]);
}

#[test]
fn the_toolkit_stub_is_recognised() {
    let test = "the_toolkit_stub_is_recognised";
    let cc = cc(test);
    let dir = fakelib::folder(test);
    all_four(&cc, &dir, None);
    // stubs/libcuda.so: every function answers CUDA_ERROR_STUB_LIBRARY.
    let bodies: Vec<String> = CUDA
        .symbols
        .iter()
        .map(|s| format!("int {s}() {{ return 34; }}"))
        .collect();
    let lib = fakelib::build(&cc, &dir, "libcuda.so", &(bodies.join("\n") + "\n"), &[]);
    let why = format!(
        "{}: cuDriverGetVersion failed with code 34 (CUDA_ERROR_STUB_LIBRARY: this is the CUDA \
         toolkit's link stub, not the driver; take its folder off LD_LIBRARY_PATH)",
        real(&lib)
    );
    assert!(row(&info(&dir), "libcuda").contains(&why));
    assert_falls_back(&dir, &[&why]);
    assert_gpu_fails(&dir, &[&why]);
}

#[test]
fn a_library_that_does_not_load_is_named_with_the_loader_s_words() {
    let test = "a_library_that_does_not_load_is_named_with_the_loader_s_words";
    let cc = cc(test);
    let dir = fakelib::folder(test);
    all_four(&cc, &dir, None);
    let lib = dir.join("libcublasLt.so");
    std::fs::write(&lib, "not a shared object\n").expect("write");
    let text = info(&dir);
    let r = row(&text, "cuBLASLt");
    assert!(
        r.contains("UNUSABLE") && r.contains("cannot be loaded: ") && r.contains("libcublasLt.so"),
        "{text}"
    );
    assert_falls_back(&dir, &["cuBLASLt unusable: cannot be loaded: "]);
    assert_gpu_fails(&dir, &["cuBLASLt unusable: cannot be loaded: "]);
}

#[test]
fn an_nccl_runtime_without_a_function_is_named() {
    let test = "an_nccl_runtime_without_a_function_is_named";
    let cc = cc(test);
    let dir = fakelib::folder(test);
    all_four(&cc, &dir, None);
    // Only the runtime package's name: ficco links libnccl.so to it and
    // re-executes itself (nccl_soname_shim), then probes it.
    std::fs::remove_file(dir.join("libnccl.so")).expect("remove");
    let lib = fakelib::fake(
        &cc,
        &dir,
        "libnccl.so.2",
        &NCCL,
        &["ncclCommInitRankConfig"],
        &[],
    );
    let why = format!("{} has no symbol ncclCommInitRankConfig", real(&lib));
    let text = info(&dir);
    let r = row(&text, "NCCL");
    assert!(r.contains("UNUSABLE") && r.contains(&why), "{text}");
    assert_falls_back(&dir, &["NCCL unusable", &why]);
    assert_gpu_fails(&dir, &["NCCL unusable", &why]);
}

/// With no library at all: the no-GPU error is one short line, and the 30
/// file names tried for the driver appear only with `--verbose`.
#[test]
fn missing_libraries_are_one_short_line_with_the_search_list_behind_verbose() {
    let test = "missing_libraries_are_one_short_line_with_the_search_list_behind_verbose";
    if ficco_cuda::Libraries::probe().cuda.found {
        eprintln!("SKIPPED: {test}: this machine has libcuda outside LD_LIBRARY_PATH");
        return;
    }
    let dir = fakelib::folder(test);
    let line = assert_gpu_fails(
        &dir,
        &[
            "GPU backend not available: libcuda (the CUDA driver) not found; add the folder that \
             holds it to LD_LIBRARY_PATH (or run with --backend sim to simulate; --verbose lists \
             the 30 file names tried)",
        ],
    );
    assert!(line.len() < 220, "{} characters: {line}", line.len());
    assert!(!line.contains("libcuda.so"), "{line}");

    let args = [&["--verbose", "explore", "--backend", "gpu"], &SHAPE[..]].concat();
    let o = ficco_with(&dir, &args);
    assert_error(&o, &args, &["libcuda (the CUDA driver) not found"]);
    let err = stderr(&o);
    let tried = ficco_cuda::loader::candidates(CUDA.stems).join(", ");
    assert!(
        err.contains(&format!(
            "ficco: file names tried for libcuda (the CUDA driver): {tried}\n"
        )),
        "{err}"
    );
    assert!(!err.contains("--verbose lists"), "{err}");

    let text = info(&dir);
    assert!(row(&text, "libcuda").contains("missing   not found (30 file names tried)"));
    assert!(
        text.ends_with("# --verbose lists the file names tried\n"),
        "{text}"
    );
    assert!(!text.contains("libcuda64.so"), "{text}");
    let o = ficco_with(&dir, &["info", "--verbose"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(
        stdout(&o).contains(&format!("tried {tried}\n")),
        "{}",
        stdout(&o)
    );
}

/// `--verbose` goes with the commands that load the CUDA libraries (explore,
/// evaluate, tune, info, characterize, gemm-bench), after their name or, as
/// before, ahead of it; the others do not offer it (issue 31). Alone it asks
/// for a command like a bare `ficco` does.
#[test]
fn verbose_goes_with_the_commands_that_load_libraries() {
    support::assert_fails(&["--verbose"], "a command is required");
    let plain = stdout(&support::ficco(&[
        "schedules",
        "--op",
        "ag-gemm",
        "--gpus",
        "2",
    ]));
    assert!(plain.contains("shard-copy-ring"), "{plain}");
    let o = support::ficco(&["--verbose", "schedules", "--op", "ag-gemm", "--gpus", "2"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o), plain);
    support::assert_fails(
        &["schedules", "--op", "ag-gemm", "--gpus", "2", "--verbose"],
        "unexpected argument '--verbose'",
    );
    for cmd in [
        "explore",
        "evaluate",
        "tune",
        "info",
        "characterize",
        "gemm-bench",
    ] {
        let help = stdout(&support::ficco(&[cmd, "--help"]));
        assert!(help.contains("--verbose"), "{cmd}: {help}");
    }
    for cmd in ["schedules", "select"] {
        let help = stdout(&support::ficco(&[cmd, "--help"]));
        assert!(!help.contains("--verbose"), "{cmd}: {help}");
    }
}
