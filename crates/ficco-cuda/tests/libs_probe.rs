//! The library probe on fake libraries (compiled here with the system C
//! compiler, opened by path in this process): every way a library can be
//! present but unusable gives a typed reason naming the file and what is
//! wrong, the probe picks the first candidate that loads (as cudarc does),
//! and nothing panics. Needs no GPU and no CUDA, but a C compiler: without
//! one each test fails, saying so.

use ficco_testkit::fakelib;

use ficco_cuda::loader::{
    probe_library, LibProblem, LibSpec, LibStatus, Libraries, CUBLASLT, CUDA, NCCL, NVRTC,
};
use ficco_cuda::CudaError;
use proptest::prelude::*;
use std::path::{Path, PathBuf};

/// The C compiler; fails `test` without one.
fn cc(test: &str) -> String {
    fakelib::compiler_for(test)
}

fn probe(spec: &LibSpec, path: &Path) -> LibStatus {
    probe_library(spec, vec![path.display().to_string()])
}

fn real(p: &Path) -> String {
    std::fs::canonicalize(p)
        .expect("the fake exists")
        .display()
        .to_string()
}

#[test]
fn complete_fakes_of_supported_versions_are_usable() {
    let cc = cc("complete_fakes_of_supported_versions_are_usable");
    let dir = fakelib::folder("complete");
    for (spec, file, version) in [
        (&CUDA, "libcuda.so.1", "13.0"),
        (&CUBLASLT, "libcublasLt.so.13", "13.1.0"),
        (&NCCL, "libnccl.so.2", "2.28.3"),
        (&NVRTC, "libnvrtc.so.13", "13.0"),
    ] {
        let p = fakelib::fake(&cc, &dir, file, spec, &[], &[]);
        let s = probe(spec, &p);
        assert!(s.found && s.usable, "{s:?}");
        assert_eq!(s.problem, None);
        assert_eq!(s.path.as_deref(), Some(real(&p).as_str()));
        assert_eq!(
            s.version.as_ref().map(|v| v.to_string()).as_deref(),
            Some(version)
        );
    }
}

#[test]
fn a_missing_symbol_is_named_with_the_file() {
    let cc = cc("a_missing_symbol_is_named_with_the_file");
    let dir = fakelib::folder("nosym");
    let p = fakelib::fake(&cc, &dir, "libcuda.so.1", &CUDA, &["cuInit"], &[]);
    let s = probe(&CUDA, &p);
    assert!(s.found && !s.usable, "{s:?}");
    assert_eq!(
        s.problem,
        Some(LibProblem::MissingSymbols {
            path: real(&p),
            missing: vec!["cuInit".into()],
            needed: CUDA.symbols.len(),
        })
    );
    let text = s
        .problem
        .as_ref()
        .map(|p| p.to_string())
        .unwrap_or_default();
    assert_eq!(text, format!("{} has no symbol cuInit", real(&p)));

    // As the backend sees it: a typed "unusable", not a panic in cudarc.
    let libs = Libraries::probe_with(|spec| {
        if std::ptr::eq(spec, &CUDA) {
            vec![p.display().to_string()]
        } else {
            vec![]
        }
    });
    match libs.require_all() {
        Err(e @ CudaError::LibraryUnusable { .. }) => {
            let m = e.to_string();
            assert!(m.starts_with("libcuda (the CUDA driver) unusable: "), "{m}");
            assert!(m.contains("cuInit") && m.contains(&real(&p)), "{m}");
            assert!(ficco_cuda::open::is_unavailable(&e));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_library_that_is_not_one_lists_how_many_functions_it_lacks() {
    let cc = cc("a_library_that_is_not_one_lists_how_many_functions_it_lacks");
    let dir = fakelib::folder("empty");
    let p = fakelib::build(
        &cc,
        &dir,
        "libnccl.so",
        "int unrelated(void) { return 0; }\n",
        &[],
    );
    let s = probe(&NCCL, &p);
    match &s.problem {
        Some(LibProblem::MissingSymbols {
            missing, needed, ..
        }) => {
            assert_eq!(missing.len(), NCCL.symbols.len());
            assert_eq!(*needed, NCCL.symbols.len());
            assert_eq!(missing[0], "ncclGetVersion");
        }
        other => panic!("{other:?}"),
    }
    let text = s.problem.map(|p| p.to_string()).unwrap_or_default();
    assert!(
        text.ends_with(&format!(
            "has no symbol ncclGetVersion, nor {} more of the {} functions ficco calls",
            NCCL.symbols.len() - 1,
            NCCL.symbols.len()
        )),
        "{text}"
    );
}

#[test]
fn wrong_versions_are_unusable_with_what_ficco_needs() {
    let cc = cc("wrong_versions_are_unusable_with_what_ficco_needs");
    let dir = fakelib::folder("version");
    let cases: [(&LibSpec, &str, &str, &str, &str); 4] = [
        (
            &CUDA,
            "libcuda.so.1",
            "int cuDriverGetVersion(int *v) { *v = 12020; return 0; }",
            "12.2",
            "a driver for CUDA 13.0 or newer",
        ),
        (
            &CUBLASLT,
            "libcublasLt.so.12",
            "unsigned long cublasLtGetVersion(void) { return 120903; }",
            "12.9.3",
            "major version 13",
        ),
        (
            &NVRTC,
            "libnvrtc.so.12",
            "int nvrtcVersion(int *a, int *b) { *a = 12; *b = 8; return 0; }",
            "12.8",
            "major version 13",
        ),
        (
            &NCCL,
            "libnccl.so",
            "int ncclGetVersion(int *v) { *v = 30100; return 0; }",
            "3.1.0",
            "NCCL 2",
        ),
    ];
    for (spec, file, body, found, needs) in cases {
        let p = fakelib::fake(&cc, &dir, file, spec, &[], &[(spec.version_symbol, body)]);
        let s = probe(spec, &p);
        assert!(s.found && !s.usable, "{s:?}");
        match &s.problem {
            Some(LibProblem::WrongVersion {
                path,
                found: f,
                needs: n,
            }) => {
                assert_eq!(path, &real(&p));
                assert_eq!(f, found);
                assert!(n.starts_with(needs), "{n}");
            }
            other => panic!("{}: {other:?}", spec.name),
        }
        // The version is still reported, for `ficco info`.
        assert_eq!(s.version.map(|v| v.to_string()).as_deref(), Some(found));
    }
}

#[test]
fn the_toolkit_stub_driver_is_recognised() {
    let cc = cc("the_toolkit_stub_driver_is_recognised");
    let dir = fakelib::folder("stub");
    // The toolkit's stubs/libcuda.so exports everything and answers
    // CUDA_ERROR_STUB_LIBRARY (34) to every call.
    let p = fakelib::fake(
        &cc,
        &dir,
        "libcuda.so",
        &CUDA,
        &[],
        &[
            (
                "cuDriverGetVersion",
                "int cuDriverGetVersion(int *v) { (void)v; return 34; }",
            ),
            ("cuInit", "int cuInit(unsigned f) { (void)f; return 34; }"),
        ],
    );
    let s = probe(&CUDA, &p);
    match &s.problem {
        Some(LibProblem::VersionUnreadable {
            call,
            code,
            meaning,
            ..
        }) => {
            assert_eq!((call.as_str(), *code), ("cuDriverGetVersion", 34));
            assert!(
                meaning.as_deref().is_some_and(|m| m.contains("stub")),
                "{meaning:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    let text = s.problem.map(|p| p.to_string()).unwrap_or_default();
    assert!(
        text.contains("cuDriverGetVersion failed with code 34 (CUDA_ERROR_STUB_LIBRARY"),
        "{text}"
    );
}

#[test]
fn files_the_loader_refuses_are_unusable_with_its_words() {
    let cc = cc("files_the_loader_refuses_are_unusable_with_its_words");
    let dir = fakelib::folder("refused");
    // Not a shared object at all.
    let garbage = dir.join("libcublasLt.so");
    std::fs::write(&garbage, b"this is not an ELF file, it is text\n").expect("write");
    let s = probe(&CUBLASLT, &garbage);
    assert!(!s.found && !s.usable, "{s:?}");
    match &s.problem {
        Some(LibProblem::LoadFailed { error }) => {
            assert!(error.contains(&garbage.display().to_string()), "{error}")
        }
        other => panic!("{other:?}"),
    }
    // A real shared object whose dependency is gone: the error names the
    // dependency, and the library still counts as present but unusable.
    let dep = fakelib::build(
        &cc,
        &dir,
        "libficcofakedep.so",
        "int dep(void) { return 0; }\n",
        &[],
    );
    let src =
        fakelib::source(&NVRTC, &[], &[]) + "int dep(void);\nint use_dep(void) { return dep(); }\n";
    let dir_arg = format!("-L{}", dir.display());
    let p = fakelib::build(
        &cc,
        &dir,
        "libnvrtc.so",
        &src,
        &[&dir_arg, "-lficcofakedep"],
    );
    std::fs::remove_file(&dep).expect("remove the dependency");
    let s = probe(&NVRTC, &p);
    match &s.problem {
        Some(LibProblem::LoadFailed { error }) => {
            assert!(error.contains("libficcofakedep.so"), "{error}")
        }
        other => panic!("{other:?}"),
    }
    let libs = Libraries::probe_with(|spec| {
        if std::ptr::eq(spec, &NVRTC) {
            vec![p.display().to_string()]
        } else {
            vec![]
        }
    });
    assert!(matches!(
        libs.nvrtc.problem,
        Some(LibProblem::LoadFailed { .. })
    ));
}

#[test]
fn the_first_candidate_that_loads_is_the_one_probed() {
    let cc = cc("the_first_candidate_that_loads_is_the_one_probed");
    let dir = fakelib::folder("order");
    let absent = dir.join("libcuda.so").display().to_string();
    let garbage = dir.join("libcuda64.so");
    std::fs::write(&garbage, b"garbage").expect("write");
    let good = fakelib::fake(&cc, &dir, "libcuda.so.1", &CUDA, &[], &[]);
    let broken = fakelib::fake(&cc, &dir, "libcuda.so.13", &CUDA, &["cuLaunchKernel"], &[]);
    let names = |ps: &[&PathBuf]| ps.iter().map(|p| p.display().to_string()).collect();
    // Absent and refused files are passed over, as cudarc passes them over.
    let mut c: Vec<String> = vec![absent.clone(), garbage.display().to_string()];
    c.extend::<Vec<String>>(names(&[&good, &broken]));
    let s = probe_library(&CUDA, c.clone());
    assert!(s.usable, "{s:?}");
    assert_eq!(s.path.as_deref(), Some(real(&good).as_str()));
    assert_eq!(s.searched, c);
    // The first that loads decides, even where a later one would do.
    let s = probe_library(&CUDA, names(&[&broken, &good]));
    assert!(
        matches!(s.problem, Some(LibProblem::MissingSymbols { .. })),
        "{s:?}"
    );
    // Nothing there: not found, with the names tried.
    let s = probe_library(&CUDA, vec![absent.clone()]);
    assert_eq!(s.problem, Some(LibProblem::NotFound));
    let libs = Libraries::probe_with(|_| vec![absent.clone()]);
    match libs.require_all() {
        Err(CudaError::LibraryMissing {
            lib,
            searched,
            hint,
        }) => {
            assert_eq!(lib, "libcuda (the CUDA driver)");
            assert_eq!(searched, vec![absent.clone()]);
            assert!(hint.contains("LD_LIBRARY_PATH"), "{hint}");
        }
        other => panic!("{other:?}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// Whatever subset of NCCL's functions a library lacks, the probe names
    /// exactly those, in the order ficco lists them, and the library is
    /// usable exactly when none is missing.
    #[test]
    fn any_missing_subset_is_reported_exactly(mask in proptest::collection::vec(any::<bool>(), NCCL.symbols.len())) {
        let cc = fakelib::compiler_for("any_missing_subset_is_reported_exactly");
        let omit: Vec<&str> = NCCL.symbols.iter().zip(&mask).filter(|(_, m)| **m).map(|(s, _)| *s).collect();
        let dir = fakelib::folder("subset");
        let file = format!("libnccl-{}.so", mask.iter().map(|m| if *m { '1' } else { '0' }).collect::<String>());
        let p = fakelib::fake(&cc, &dir, &file, &NCCL, &omit, &[]);
        let s = probe(&NCCL, &p);
        prop_assert!(s.found);
        prop_assert_eq!(s.usable, omit.is_empty());
        if omit.is_empty() {
            prop_assert_eq!(s.problem, None);
        } else {
            prop_assert_eq!(s.problem, Some(LibProblem::MissingSymbols {
                path: real(&p),
                missing: omit.iter().map(|s| s.to_string()).collect(),
                needed: NCCL.symbols.len(),
            }));
        }
    }
}
