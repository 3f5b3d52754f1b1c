//! `vvm:host/lease` and `vvm:host/log` (SPEC §7): the lease a service runs under, the signal
//! to stop, a problem report, and log lines. Every call is fenced by the per-call check
//! (`env`); the two with an effect (a problem report, a log line) also say which effect they
//! refused. What a guest logs or reports becomes host log lines through `output`.

use tokio_util::sync::CancellationToken;
use wasmtime::component::Resource;
use wasmtime_wasi::p2::{DynPollable, Pollable, subscribe};

use super::bindings::service::vvm::host::{lease, log};
use super::output::{guest_lines, guest_text};
use super::view::Interfaces;
use crate::problem::Problem;

/// The pollable behind `lease.stopping`: ready once the service must stop.
struct StopSignal(CancellationToken);

#[wasmtime_wasi::async_trait]
impl Pollable for StopSignal {
    async fn ready(&mut self) {
        self.0.cancelled().await;
    }
}

impl lease::Host for Interfaces {
    async fn current(&mut self) -> wasmtime::Result<lease::Info> {
        let l = &self.env.lease;
        Ok(lease::Info {
            slot: l.slot,
            holder: l.holder.clone(),
            term: l.term,
            lease_ms: u64::try_from(l.lease.as_millis()).unwrap_or(u64::MAX),
        })
    }

    async fn stopping(&mut self) -> wasmtime::Result<Resource<DynPollable>> {
        let signal = self.table.push(StopSignal(self.env.stopping.clone()))?;
        subscribe(&mut self.table, signal)
    }

    async fn report_problem(&mut self, message: String) -> wasmtime::Result<()> {
        self.env.fence("problem report")?;
        let message = guest_text(&message);
        tracing::warn!(service = &*self.env.name, %message, "guest reported a problem");
        self.env.problems.report(Problem::Service {
            name: self.env.name.to_string(),
            reason: message,
        });
        Ok(())
    }
}

impl log::Host for Interfaces {
    async fn log(&mut self, level: log::Level, message: String) -> wasmtime::Result<()> {
        self.env.fence("log line")?;
        let service = &*self.env.name;
        for line in guest_lines(&message) {
            match level {
                log::Level::Trace => tracing::trace!(service, "{line}"),
                log::Level::Debug => tracing::debug!(service, "{line}"),
                log::Level::Info => tracing::info!(service, "{line}"),
                log::Level::Warn => tracing::warn!(service, "{line}"),
                log::Level::Error => tracing::error!(service, "{line}"),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use std::sync::Arc;

    use super::*;
    use crate::interfaces::bindings::service::vvm::host::kv;
    use crate::interfaces::env::tests::env;
    use crate::interfaces::env::{Fenced, ServiceEnv};
    use crate::interfaces::keyvalue::access::KvAccess;

    fn host(env: &Arc<ServiceEnv>) -> Interfaces {
        crate::interfaces::view::tests::interfaces(env, KvAccess::default())
    }

    /// A guest cannot forge or hide host log lines with what it logs or reports, nor flood the
    /// log with one call: each line of a message is its own event, tagged with the service,
    /// control characters are escaped, and a problem's reason is bounded.
    #[test]
    fn what_a_guest_logs_or_reports_stays_its_own_bounded_lines() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (_clock, env) = rt.block_on(env());
        let mut h = host(&env);
        let forged = "real\n2026-11-24T00:00:00Z  INFO vvm_host::elections: acquired\rcover";
        let lines = testkit::logs::capture(|| {
            rt.block_on(log::Host::log(&mut h, log::Level::Info, forged.into()))
                .unwrap();
        });
        let messages: Vec<&str> = lines.iter().map(|l| l.message.as_str()).collect();
        assert_eq!(
            messages,
            [
                "real",
                "2026-11-24T00:00:00Z  INFO vvm_host::elections: acquired\\rcover"
            ]
        );
        assert!(
            lines.iter().all(|l| l.service.as_deref() == Some("svc")),
            "tagged"
        );
        rt.block_on(lease::Host::report_problem(&mut h, "p".repeat(1 << 20)))
            .unwrap();
        let Some(Problem::Service { reason, .. }) = env.problems.get() else {
            panic!("no problem reported")
        };
        assert!(reason.len() < 20 * 1024, "{} bytes", reason.len());
        assert!(
            reason.ends_with("more bytes)"),
            "{}",
            &reason[reason.len() - 30..]
        );
    }

    #[tokio::test]
    async fn effects_before_the_deadline_take_effect() {
        let (_clock, env) = env().await;
        let mut h = host(&env);
        lease::Host::report_problem(&mut h, "bad".into())
            .await
            .unwrap();
        assert_eq!(
            env.problems.get(),
            Some(Problem::Service {
                name: "svc".into(),
                reason: "bad".into()
            })
        );
        kv::Host::set(&mut h, "k".into(), b"v".to_vec())
            .await
            .unwrap()
            .unwrap();
        let got = kv::Host::get(&mut h, "k".into()).await.unwrap().unwrap();
        assert_eq!(got, Some(b"v".to_vec()));
        log::Host::log(&mut h, log::Level::Info, "hi".into())
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn effects_after_the_deadline_trap_and_do_nothing() {
        let (clock, env) = env().await;
        let mut h = host(&env);
        clock.advance(Duration::from_mins(1));
        let e = lease::Host::report_problem(&mut h, "bad".into())
            .await
            .unwrap_err();
        assert!(e.is::<Fenced>(), "{e}");
        assert_eq!(env.problems.get(), None);
        let e = kv::Host::set(&mut h, "k".into(), b"v".to_vec())
            .await
            .unwrap_err();
        assert!(e.is::<Fenced>(), "{e}");
        assert_eq!(env.store.kv_get("svc", "k").await.unwrap(), None);
        let e = log::Host::log(&mut h, log::Level::Info, "hi".into())
            .await
            .unwrap_err();
        assert!(e.is::<Fenced>(), "{e}");
        // Reading and asking about the lease have no effect: still allowed.
        assert_eq!(kv::Host::get(&mut h, "k".into()).await.unwrap(), Ok(None));
        assert_eq!(
            lease::Host::current(&mut h).await.unwrap().term,
            env.lease.term
        );
    }
}
