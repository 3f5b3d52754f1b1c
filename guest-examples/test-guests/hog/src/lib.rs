//! Test guest: allocates (and touches) memory without bound.

use std::hint::black_box;

use vvm_guest::{Guest, info};

struct Hog;

impl Guest for Hog {
    fn run() -> Result<(), String> {
        info("hogging memory");
        let mut chunks: Vec<Vec<u8>> = Vec::new();
        loop {
            chunks.push(black_box(vec![1u8; 1 << 20]));
        }
    }
}

vvm_guest::export!(Hog);
