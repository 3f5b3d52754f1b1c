//! `wasi:http/outgoing-handler.handle`, denying inside the call (SPEC §10). The crate's
//! `handle` hands every request to `send_request` and reports a denial only through the
//! response future, which some guests cannot take: componentize-js's engine aborts when a
//! `fetch` with a body is refused after its body stream was handed over. WASI lets `handle`
//! itself return an error for a request that may not be made, so a request the allow-list does
//! not name is refused here, before the crate sees it; the rest goes to the crate's `handle`.

use hyper::http::uri::{Authority, Scheme as UriScheme};
use wasmtime::StoreContextMut;
use wasmtime::component::{Linker, Resource};
use wasmtime_wasi_http::WasiHttpView;
use wasmtime_wasi_http::p2::bindings::http::outgoing_handler::Host as _;
use wasmtime_wasi_http::p2::bindings::http::types::{ErrorCode, Scheme};
use wasmtime_wasi_http::p2::types::{HostFutureIncomingResponse, HostOutgoingRequest};

use super::{OutgoingHttp, Target};

/// The WASI version whose `handle` this replaces (wasmtime-wasi-http 48's bindings).
const WASI_HTTP: &str = "0.2.12";

type Handled = Result<Resource<HostFutureIncomingResponse>, ErrorCode>;

/// Replaces `handle` in `linker` (after `add_only_http_to_linker_async`): a request the
/// allow-list of `outgoing(store data)` does not name fails with `HTTP-request-denied` from
/// the call itself.
pub(crate) fn link_handle<T: WasiHttpView + 'static>(
    linker: &mut Linker<T>,
    outgoing: fn(&mut T) -> &mut OutgoingHttp,
) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let mut handler = linker.instance(&format!("wasi:http/outgoing-handler@{WASI_HTTP}"))?;
    handler.func_wrap(
        "handle",
        move |mut cx: StoreContextMut<'_, T>,
              (request, options): (
            Resource<HostOutgoingRequest>,
            Option<Resource<wasmtime_wasi_http::RequestOptions>>,
        )| {
            let data = cx.data_mut();
            let target = target(data.http().table.get(&request)?);
            if let Some(target) = target
                && outgoing(data).admit(&target).is_none()
            {
                // Both handles were the guest's to give: they go with the refusal.
                let view = data.http();
                view.table.delete(request)?;
                if let Some(options) = options {
                    view.table.delete(options)?;
                }
                return Ok((Err::<Resource<HostFutureIncomingResponse>, _>(
                    ErrorCode::HttpRequestDenied,
                ),));
            }
            let handled: Handled = match data.http().handle(request, options) {
                Ok(response) => Ok(response),
                Err(e) => Err(e.downcast()?),
            };
            Ok((handled,))
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

/// Where `request` goes, as the crate will read it (a missing scheme is https, its default);
/// `None` where the crate refuses the request itself (an unknown scheme, a bad authority).
fn target(request: &HostOutgoingRequest) -> Option<Target> {
    let https = match &request.scheme {
        None | Some(Scheme::Https) => true,
        Some(Scheme::Http) => false,
        Some(Scheme::Other(_)) => return None,
    };
    let authority: Authority = request.authority.as_deref().unwrap_or("").parse().ok()?;
    let uri = hyper::Uri::builder()
        .scheme(if https {
            UriScheme::HTTPS
        } else {
            UriScheme::HTTP
        })
        .authority(authority)
        .path_and_query("/")
        .build()
        .ok()?;
    super::target_of(&uri)
}
