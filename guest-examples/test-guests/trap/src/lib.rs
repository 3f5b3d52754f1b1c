//! Test guest: traps as soon as `run` is called.

use vvm_guest::Guest;

struct Trap;

impl Guest for Trap {
    fn run() -> Result<(), String> {
        panic!("trap guest: failing on purpose");
    }
}

vvm_guest::export!(Trap);
