//! With the `c-library` feature (the wheel's build turns it on), also build the C library,
//! `libnpumem.so`, and put it next to the Python sources (`python/npumem/`), where the wheel
//! picks it up (`tool.maturin.include`) and `npumem.get_library()` finds it.
//!
//! Cargo builds one shared library per package, and this package's is the Python extension,
//! so the C library comes from a second cargo run over the `npumem-capi` package, in a target
//! directory of its own (this run holds the lock on the outer one). Where the environment names
//! one already built, `NPUMEM_C_LIBRARY` (`make test` builds it with `cargo build -p
//! npumem-capi`, in the target directory that the Rust tests share), that one is copied instead.
//!
//! The copy is watched too, so that a wheel built in the checkout does not ship a missing or
//! stale library: cargo reruns this script when the copy is gone or newer than the script's last
//! run, as another build's copy is (`copy` dates its own so that it alone does not). A file put
//! there with an older date kept (`cp -p`) goes unnoticed; `make wheel` builds from the sdist,
//! in a folder of its own, and never reads this copy.

use std::env;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let workspace = manifest.join("../..");
    for watched in ["rust/capi/src", "rust/capi/Cargo.toml", "rust/core/src", "rust/core/Cargo.toml"] {
        println!("cargo:rerun-if-changed={}", workspace.join(watched).display());
    }
    println!("cargo:rerun-if-env-changed=NPUMEM_C_LIBRARY");
    if env::var_os("CARGO_FEATURE_C_LIBRARY").is_none() {
        return;
    }
    let name = match env::var("CARGO_CFG_TARGET_OS").as_deref() {
        Ok("macos") => "libnpumem.dylib",
        Ok("windows") => "npumem.dll",
        _ => "libnpumem.so",
    };
    let destination = workspace.join("python/npumem").join(name);
    if let Some(built) = env::var_os("NPUMEM_C_LIBRARY") {
        let built = PathBuf::from(built);
        println!("cargo:rerun-if-changed={}", built.display());
        copy(&built, &destination);
        return;
    }
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let target_dir = out.join("capi-target");
    let profile = profile_dir(&out);
    let (target, host) = (env::var("TARGET").unwrap_or_default(), env::var("HOST").unwrap_or_default());
    let mut cargo = Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cargo
        .current_dir(&workspace)
        .args(["build", "--package", "npumem-capi", "--lib", "--locked", "--target-dir"])
        .arg(&target_dir)
        .env_remove("CARGO_TARGET_DIR")
        // Its intermediate files too go to that directory: under a build directory of the
        // outer run's (`build.build-dir`), the inner run would wait for the outer run's lock.
        .env("CARGO_BUILD_BUILD_DIR", &target_dir)
        // A library of the release profile (the tests', a wheel's `dist` inherits it) carries
        // no debug information.
        .env("CARGO_PROFILE_RELEASE_DEBUG", "0")
        .env("CARGO_PROFILE_RELEASE_STRIP", "debuginfo");
    if profile != "debug" {
        cargo.args(["--profile", &profile]);
    }
    let mut built = target_dir.clone();
    if !target.is_empty() && target != host {
        cargo.args(["--target", &target]);
        built.push(&target);
    }
    let status = cargo.status().expect("could not run cargo to build the C library");
    assert!(status.success(), "building the C library (npumem-capi) failed: {status}");
    let library = built.join(&profile).join(name);
    copy(&library, &destination);
}

/// The profile this build runs under, by the name of its output folder: `OUT_DIR` lies in
/// `<profile>/build/` (`<target>/[<triple>/]<profile>/build/<package>-<hash>/out`, or deeper
/// under `build/` in cargo's newer layouts), and the folder of the `dev` profile is `debug`.
/// (`PROFILE` names only `release` or `debug`: a wheel's `dist` profile, link-time optimized,
/// reads `release` there; it stands in when the path has no `build` folder.) The C library is
/// built with the same profile.
fn profile_dir(out: &Path) -> String {
    let from_path = out
        .ancestors()
        .find(|folder| folder.file_name().is_some_and(|name| name == "build"))
        .and_then(Path::parent)
        .and_then(Path::file_name)
        .and_then(|name| name.to_str());
    match from_path {
        Some(name) => name.to_owned(),
        None => env::var("PROFILE").unwrap_or_else(|_| "release".into()),
    }
}

/// Copy `library` to `destination` and watch the copy. Cargo reruns a build script when a file
/// it watches is newer than the start of the script's last run, or gone; the copy is dated to the
/// start of this run, so that it does not rerun this script, while a copy that another build
/// wrote later (the tests' or another profile's, in a target directory of their own), or any
/// other file put in its place, does. Cargo records the start in `invoked.timestamp`, beside
/// `OUT_DIR`; without that file, the library's time or this script's own (built before it ran),
/// whichever is earlier, stands in: a library that this run built itself is newer than the run.
fn copy(library: &Path, destination: &Path) {
    fs::copy(library, destination)
        .unwrap_or_else(|e| panic!("could not copy {} to {}: {e}", library.display(), destination.display()));
    let modified = |path: &Path| fs::metadata(path).and_then(|m| m.modified()).ok();
    let out = env::var_os("OUT_DIR").map(PathBuf::from);
    let started = out.as_deref().and_then(Path::parent).and_then(|run| modified(&run.join("invoked.timestamp")));
    let time = started.unwrap_or_else(|| {
        let script = env::current_exe().ok().and_then(|exe| modified(&exe));
        [modified(library), script].into_iter().flatten().min().unwrap_or(SystemTime::UNIX_EPOCH)
    });
    if let Err(e) = File::options().write(true).open(destination).and_then(|f| f.set_modified(time)) {
        // Not fatal: the copy is right, only newer than the run, which then reruns every build.
        println!("cargo:warning=could not date {} back: {e}", destination.display());
    }
    println!("cargo:rerun-if-changed={}", destination.display());
}
