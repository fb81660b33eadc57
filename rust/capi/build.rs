//! Give the shared library the soname `libnpumem.so`, so that programs linked against it by
//! path find it again through their run path.

fn main() {
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnpumem.so");
    }
}
