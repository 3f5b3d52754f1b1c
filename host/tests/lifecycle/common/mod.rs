//! Test doubles and helpers of the lifecycle suites.

pub mod child;
pub mod journal;
pub mod services;
pub mod store;
