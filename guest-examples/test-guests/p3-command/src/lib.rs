//! Test guest: a WASI 0.3 command (`wasi:cli/run@0.3.0`), made with the `wasip3` crate: prints
//! `p3 fire <VVM_FIRE_TIME>` (the fire time a scheduled run gets) and returns.

#![allow(missing_docs)]

wasip3::cli::command::export!(Command);

struct Command;

impl wasip3::exports::cli::run::Guest for Command {
    async fn run() -> Result<(), ()> {
        let fire = std::env::var("VVM_FIRE_TIME").unwrap_or_else(|_| "none".to_owned());
        println!("p3 fire {fire}");
        Ok(())
    }
}
