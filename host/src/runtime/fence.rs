//! Fencing at the boundary (SPEC §6): no guest effect once the local lease deadline has passed.
//!
//! Every effect a guest can have is a call into the host, so the check sits where every such
//! call passes: a wasmtime call hook ([`install`]) refuses each call from the guest into the
//! host past the deadline, with a trap, before the host function runs. That covers the
//! `vvm:host` imports and every granted WASI effect alike: file and directory changes, stream
//! writes and flushes, socket connect, bind, listen, accept and send.
//!
//! A check only fences an effect that happens right after it, on the same thread. So:
//! - filesystem calls run on the calling thread (`allow_blocking_current_thread`), not on a
//!   blocking task that could land after the instance is dropped and the lease released;
//! - wasmtime-wasi's file output stream hands every `write` to a blocking task even so, so file
//!   streams are [`FileOutput`], which writes on the calling thread and checks first;
//! - a TCP output stream's `blocking-write-and-flush` waits between chunks, and each chunk is
//!   written after such a wait: TCP output streams are wrapped in [`FencedOutput`], which checks
//!   before each write and flush. A chunk the kernel could not take at once is finished by a
//!   task of wasmtime-wasi's that dies with the instance, which traps within one epoch tick
//!   once the deadline has passed.
//!
//! The guest is also interrupted at its next epoch tick past the deadline (`imports::new_store`),
//! so a guest that computes without calling the host stops too.
//!
//! HTTP bodies cross the boundary outside any call: each is a `crate::interfaces::body::DeadlineBody`, which
//! ends in an error at the deadline, parameterised by what else ends its kind.

use std::io::IoSlice;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use wasmtime::component::{Linker, Resource, ResourceTable};
use wasmtime::{CallHook, StoreContextMut};
use wasmtime_wasi::filesystem::Descriptor;
use wasmtime_wasi::p2::bindings::filesystem::types::ErrorCode as FsErrorCode;
use wasmtime_wasi::p2::bindings::sockets::network::ErrorCode as NetErrorCode;
use wasmtime_wasi::p2::bindings::sockets::tcp::HostTcpSocket;
use wasmtime_wasi::p2::{
    DynInputStream, DynOutputStream, OutputStream, Pollable, StreamError, StreamResult, TcpSocket,
};
use wasmtime_wasi::sockets::WasiSocketsView;
use wasmtime_wasi_io::bytes::Bytes;

use super::state::Host;
use crate::interfaces::Fenced;
use crate::lease::LeaseDeadline;

/// Installs the per-call fence on a store: every call from the guest into the host checks the
/// lease deadline first and traps past it.
pub(crate) fn install(store: &mut wasmtime::Store<Host>) {
    store.call_hook(|cx, hook| {
        if let CallHook::CallingHost = hook {
            cx.data().env().fence("host call")?;
        }
        Ok(())
    });
}

/// The WASI version whose functions [`shadow`] replaces (wasmtime-wasi 48's bindings).
const WASI: &str = "0.2.12";

/// Replaces the WASI functions that would start an effect the call hook cannot see: those
/// that make output streams (files: [`FileOutput`]; TCP: [`FencedOutput`]). Call after
/// `wasmtime_wasi::p2::add_to_linker_async`.
pub(crate) fn shadow(linker: &mut Linker<Host>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let mut fs = linker.instance(&format!("wasi:filesystem/types@{WASI}"))?;
    fs.func_wrap(
        "[method]descriptor.write-via-stream",
        |mut cx: StoreContextMut<'_, Host>, (fd, offset): (Resource<Descriptor>, u64)| {
            Ok((file_output(cx.data_mut(), &fd, Position::At(offset))?,))
        },
    )?;
    fs.func_wrap(
        "[method]descriptor.append-via-stream",
        |mut cx: StoreContextMut<'_, Host>, (fd,): (Resource<Descriptor>,)| {
            Ok((file_output(cx.data_mut(), &fd, Position::Append)?,))
        },
    )?;
    let mut tcp = linker.instance(&format!("wasi:sockets/tcp@{WASI}"))?;
    tcp.func_wrap(
        "[method]tcp-socket.finish-connect",
        |mut cx: StoreContextMut<'_, Host>, (this,): (Resource<TcpSocket>,)| {
            let host = cx.data_mut();
            let parent = Resource::<TcpSocket>::new_borrow(this.rep());
            let connected = match host.sockets().finish_connect(this) {
                Ok(streams) => streams,
                Err(e) => return Ok((Err(e.downcast()?),)),
            };
            let (input, output) = connected;
            let output = fence_output(host, output, &parent)?;
            Ok((Ok::<(Resource<DynInputStream>, _), NetErrorCode>((
                input, output,
            )),))
        },
    )?;
    tcp.func_wrap(
        "[method]tcp-socket.accept",
        |mut cx: StoreContextMut<'_, Host>, (this,): (Resource<TcpSocket>,)| {
            let host = cx.data_mut();
            let (socket, input, output) = match host.sockets().accept(this) {
                Ok(accepted) => accepted,
                Err(e) => return Ok((Err(e.downcast()?),)),
            };
            let parent = Resource::<TcpSocket>::new_borrow(socket.rep());
            let output = fence_output(host, output, &parent)?;
            Ok((Ok::<
                (Resource<TcpSocket>, Resource<DynInputStream>, _),
                NetErrorCode,
            >((socket, input, output)),))
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

/// `write-via-stream` / `append-via-stream`: as wasmtime-wasi checks them, but the stream is
/// a [`FileOutput`].
fn file_output(
    host: &mut Host,
    fd: &Resource<Descriptor>,
    position: Position,
) -> wasmtime::Result<Result<Resource<DynOutputStream>, FsErrorCode>> {
    let Descriptor::File(f) = host.table().get(fd)? else {
        return Ok(Err(FsErrorCode::BadDescriptor));
    };
    if f.perms.write_not_permitted() {
        return Ok(Err(FsErrorCode::NotPermitted));
    }
    let stream: DynOutputStream = Box::new(FileOutput {
        file: Arc::clone(&f.file),
        position,
        deadline: host.env().deadline.clone(),
        closed: false,
    });
    Ok(Ok(host.table().push(stream)?))
}

/// Replaces the output stream `output` (a child of `parent`) with a [`FencedOutput`] of it.
fn fence_output(
    host: &mut Host,
    output: Resource<DynOutputStream>,
    parent: &Resource<TcpSocket>,
) -> wasmtime::Result<Resource<DynOutputStream>> {
    let deadline = host.env().deadline.clone();
    let table: &mut ResourceTable = host.table();
    let inner = table.delete(output)?;
    let fenced: DynOutputStream = Box::new(FencedOutput { inner, deadline });
    Ok(table.push_child(fenced, parent)?)
}

/// The trap a stream operation past the deadline ends in.
fn refused(what: &'static str) -> StreamError {
    StreamError::Trap(Fenced::new(what).into())
}

/// Where a [`FileOutput`] writes.
#[derive(Clone, Copy, Debug)]
enum Position {
    /// At this offset, moving on with each write.
    At(u64),
    /// At the end of the file, whatever its size then.
    Append,
}

/// The most a [`FileOutput`] takes per write (what wasmtime-wasi's file stream allows).
const FILE_WRITE_CAPACITY: usize = 1 << 20;

/// A file output stream that writes on the calling thread, after checking the deadline.
///
/// wasmtime-wasi's own file stream returns from `write` at once and writes on a blocking task,
/// which can run after the deadline, after the instance is dropped, after the lease is
/// released. Here a write has happened, or failed, when the call returns.
struct FileOutput {
    file: Arc<std::fs::File>,
    position: Position,
    deadline: LeaseDeadline,
    closed: bool,
}

impl FileOutput {
    fn write_all(&mut self, mut bytes: &[u8]) -> std::io::Result<()> {
        while !bytes.is_empty() {
            let written = match self.position {
                Position::At(offset) => self.file.write_at(bytes, offset)?,
                Position::Append => rustix::io::pwritev2(
                    &*self.file,
                    &[IoSlice::new(bytes)],
                    0,
                    rustix::io::ReadWriteFlags::APPEND,
                )?,
            };
            if written == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            if let Position::At(offset) = &mut self.position {
                *offset += written as u64;
            }
            bytes = &bytes[written..];
        }
        Ok(())
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for FileOutput {
    async fn ready(&mut self) {}
}

impl OutputStream for FileOutput {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        if self.closed {
            return Err(StreamError::Closed);
        }
        if self.deadline.has_passed() {
            return Err(refused("file write"));
        }
        self.write_all(&bytes).map_err(|e| {
            self.closed = true;
            StreamError::LastOperationFailed(e.into())
        })
    }

    fn flush(&mut self) -> StreamResult<()> {
        // Nothing is buffered: every write has reached the file when it returns.
        if self.closed {
            return Err(StreamError::Closed);
        }
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        if self.closed {
            return Err(StreamError::Closed);
        }
        Ok(FILE_WRITE_CAPACITY)
    }
}

/// An output stream (a TCP connection's) that checks the deadline before each write and
/// flush, including each chunk of a `blocking-write-and-flush` or `splice`.
struct FencedOutput {
    inner: DynOutputStream,
    deadline: LeaseDeadline,
}

impl FencedOutput {
    fn check(&self, what: &'static str) -> StreamResult<()> {
        if self.deadline.has_passed() {
            Err(refused(what))
        } else {
            Ok(())
        }
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for FencedOutput {
    async fn ready(&mut self) {
        self.inner.ready().await;
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for FencedOutput {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.check("socket write")?;
        self.inner.write(bytes)
    }

    fn flush(&mut self) -> StreamResult<()> {
        self.check("socket flush")?;
        self.inner.flush()
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        self.inner.check_write()
    }

    async fn cancel(&mut self) {
        self.inner.cancel().await;
    }
}
