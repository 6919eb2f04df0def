//! The `ficco` command line: thin commands over ficco-core and ficco-cuda.
fn main() {
    println!("ficco");
}
