//! A fault-injecting TCP proxy between a Redis client and a Redis server, on a free port and a
//! thread of its own, with switchable faults: added latency per direction, all connections
//! dropped at once, one connection cut after a number of bytes or in the middle of a chosen
//! command or of its reply, a black hole (bytes are read and thrown away, nothing is
//! forwarded or answered), and a delay before each new connection reaches the server (a server
//! slow to take connections, as one is after a restart under load). It relays any TCP protocol:
//! PostgreSQL's too.

use std::collections::HashMap;
use std::io::ErrorKind;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;
use tokio::time::Instant;

/// Which way bytes flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Client to Redis: commands.
    Up,
    /// Redis to client: replies.
    Down,
}

/// Where [`Proxy::cut_on`] cuts the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CutAt {
    /// In the middle of the command: Redis never sees it whole, so never runs it.
    Request,
    /// In the middle of its reply: Redis ran the command, the client never hears the answer.
    Reply,
}

enum Cut {
    AfterBytes { dir: Direction, remaining: usize },
    OnPattern { pattern: Vec<u8>, at: CutAt },
}

/// What the proxy did so far.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ProxyStats {
    /// Client connections accepted.
    pub accepted: usize,
    /// Connections dropped by [`Proxy::drop_all`] or [`Proxy::heal`] after a black hole.
    pub dropped: usize,
    /// Armed cuts that fired.
    pub cuts: usize,
    /// Bytes swallowed by the black hole.
    pub black_holed_bytes: usize,
}

struct State {
    upstream: AtomicU16,
    latency_us: [AtomicU64; 2],
    connect_delay_us: AtomicU64,
    black_hole: AtomicBool,
    cut: Mutex<Option<Cut>>,
    conns: Mutex<HashMap<u64, AbortHandle>>,
    next_id: AtomicU64,
    accepted: AtomicUsize,
    dropped: AtomicUsize,
    cuts: AtomicUsize,
    holed: AtomicUsize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl State {
    fn latency(&self, dir: Direction) -> Duration {
        Duration::from_micros(self.latency_us[dir as usize].load(SeqCst))
    }

    /// How much of `chunk` to forward, and whether to close the connection after it.
    fn decide(&self, dir: Direction, chunk: &[u8], doomed: &AtomicBool) -> (usize, bool) {
        if dir == Direction::Down && doomed.swap(false, SeqCst) {
            self.cuts.fetch_add(1, SeqCst);
            // One byte: the first reply of the chunk is cut, whatever replies come with it (an
            // acquire's `SET` is answered together with the `TIME` sent right behind it).
            return (chunk.len().min(1), true);
        }
        let mut cut = lock(&self.cut);
        match cut.as_mut() {
            Some(Cut::AfterBytes { dir: d, remaining }) if *d == dir => {
                if chunk.len() > *remaining {
                    let forward = *remaining;
                    *cut = None;
                    self.cuts.fetch_add(1, SeqCst);
                    return (forward, true);
                }
                *remaining -= chunk.len();
            }
            Some(Cut::OnPattern { pattern, at }) if dir == Direction::Up => {
                if let Some(pos) = chunk.windows(pattern.len()).position(|w| w == pattern.as_slice()) {
                    let (at, half) = (*at, pattern.len() / 2);
                    *cut = None;
                    match at {
                        CutAt::Request => {
                            self.cuts.fetch_add(1, SeqCst);
                            return (pos + half.max(1), true);
                        }
                        CutAt::Reply => doomed.store(true, SeqCst),
                    }
                }
            }
            _ => {}
        }
        (chunk.len(), false)
    }
}

enum Msg {
    Data(Instant, Vec<u8>),
    Close(Instant),
}

/// A proxy to the Redis on `127.0.0.1:upstream`; stopped (every connection closed) when
/// dropped.
pub struct Proxy {
    port: u16,
    state: Arc<State>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    /// Starts a healthy proxy to the Redis on `upstream`.
    pub fn start(upstream: u16) -> Proxy {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        listener.set_nonblocking(true).expect("nonblocking listener");
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(State {
            upstream: AtomicU16::new(upstream),
            latency_us: [AtomicU64::new(0), AtomicU64::new(0)],
            connect_delay_us: AtomicU64::new(0),
            black_hole: AtomicBool::new(false),
            cut: Mutex::new(None),
            conns: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            accepted: AtomicUsize::new(0),
            dropped: AtomicUsize::new(0),
            cuts: AtomicUsize::new(0),
            holed: AtomicUsize::new(0),
        });
        let (tx, rx) = oneshot::channel::<()>();
        let st = state.clone();
        let thread = std::thread::Builder::new()
            .name(format!("proxy-{port}"))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("proxy runtime");
                rt.block_on(async move {
                    let listener = TcpListener::from_std(listener).expect("tokio listener");
                    tokio::select! {
                        _ = rx => {}
                        () = accept_loop(listener, st) => {}
                    }
                });
                // Dropping the runtime cancels every connection task: all sockets close.
            })
            .expect("proxy thread");
        Proxy { port, state, shutdown: Some(tx), thread: Some(thread) }
    }

    /// A proxy to the server a `scheme://host:port/rest` URL names (on 127.0.0.1), and that
    /// URL through it.
    pub fn in_front_of(url: &str) -> (Proxy, String) {
        let (server, rest) = url.rsplit_once('/').expect("a path in the URL");
        let (host, port) = server.rsplit_once(':').expect("a port in the URL");
        let proxy = Proxy::start(port.parse().expect("a port"));
        let through = format!("{host}:{}/{rest}", proxy.port());
        (proxy, through)
    }

    /// Sends the connections made from now on to the server on `upstream` (those open stay
    /// where they are: [`Proxy::drop_all`] moves them).
    pub fn set_upstream(&self, upstream: u16) {
        self.state.upstream.store(upstream, SeqCst);
    }

    /// The port the proxy listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A `redis://` URL through the proxy.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Adds `latency` to every chunk flowing in `dir` (pipelined: it delays, it does not
    /// serialize).
    pub fn set_latency(&self, dir: Direction, latency: Duration) {
        self.state.latency_us[dir as usize].store(latency.as_micros() as u64, SeqCst);
    }

    /// Holds each connection accepted from now on for `delay` before connecting it to the server
    /// (what the client sends meanwhile waits in its socket): opening a connection takes at least
    /// `delay`. Connections already open are not slowed.
    pub fn set_connect_delay(&self, delay: Duration) {
        self.state.connect_delay_us.store(delay.as_micros() as u64, SeqCst);
    }

    /// Closes every open connection now; returns how many.
    pub fn drop_all(&self) -> usize {
        let conns: Vec<AbortHandle> = lock(&self.state.conns).drain().map(|(_, h)| h).collect();
        for c in &conns {
            c.abort();
        }
        self.state.dropped.fetch_add(conns.len(), SeqCst);
        conns.len()
    }

    /// Arms a one-shot cut: the connection on which the next `bytes` bytes in `dir` have passed
    /// (counted over all connections from now on) forwards exactly those and is closed.
    pub fn cut_after(&self, dir: Direction, bytes: usize) {
        *lock(&self.state.cut) = Some(Cut::AfterBytes { dir, remaining: bytes });
    }

    /// Arms a one-shot cut on the next command whose bytes contain `pattern`: the connection is
    /// closed in the middle of that command, or in the middle of its reply.
    pub fn cut_on(&self, pattern: &[u8], at: CutAt) {
        assert!(!pattern.is_empty());
        *lock(&self.state.cut) = Some(Cut::OnPattern { pattern: pattern.to_vec(), at });
    }

    /// Disarms a cut that has not fired.
    pub fn disarm(&self) {
        *lock(&self.state.cut) = None;
    }

    /// From now on, reads and throws away everything in both directions: connections stay open,
    /// new ones are accepted, nothing is forwarded or answered.
    pub fn black_hole(&self) {
        self.state.black_hole.store(true, SeqCst);
    }

    /// Back to healthy: no latency, no connect delay, no armed cut; after a black hole, the connections that lost
    /// bytes in it are dropped (their protocol streams are broken), so clients reconnect.
    pub fn heal(&self) {
        self.set_latency(Direction::Up, Duration::ZERO);
        self.set_latency(Direction::Down, Duration::ZERO);
        self.set_connect_delay(Duration::ZERO);
        self.disarm();
        if self.state.black_hole.swap(false, SeqCst) {
            self.drop_all();
        }
    }

    pub fn stats(&self) -> ProxyStats {
        let s = &self.state;
        ProxyStats {
            accepted: s.accepted.load(SeqCst),
            dropped: s.dropped.load(SeqCst),
            cuts: s.cuts.load(SeqCst),
            black_holed_bytes: s.holed.load(SeqCst),
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn accept_loop(listener: TcpListener, state: Arc<State>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        };
        let _ = client.set_nodelay(true);
        state.accepted.fetch_add(1, SeqCst);
        let id = state.next_id.fetch_add(1, SeqCst);
        let st = state.clone();
        // Registered under the lock, so the task cannot deregister before it is registered.
        let mut conns = lock(&state.conns);
        let task = tokio::spawn(async move {
            let _registered = Deregister(st.clone(), id);
            let delay = Duration::from_micros(st.connect_delay_us.load(SeqCst));
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            if let Ok(server) = TcpStream::connect(("127.0.0.1", st.upstream.load(SeqCst))).await {
                let _ = server.set_nodelay(true);
                serve(&st, &client, &server).await;
            }
        });
        conns.insert(id, task.abort_handle());
    }
}

struct Deregister(Arc<State>, u64);

impl Drop for Deregister {
    fn drop(&mut self) {
        lock(&self.0.conns).remove(&self.1);
    }
}

/// Forwards both ways until either side closes or a fault closes the connection.
async fn serve(st: &State, client: &TcpStream, server: &TcpStream) {
    let doomed = AtomicBool::new(false);
    let (up_tx, up_rx) = mpsc::unbounded_channel();
    let (down_tx, down_rx) = mpsc::unbounded_channel();
    tokio::select! {
        () = pump(st, Direction::Up, client, up_tx, &doomed) => {}
        () = deliver(st, server, up_rx) => {}
        () = pump(st, Direction::Down, server, down_tx, &doomed) => {}
        () = deliver(st, client, down_rx) => {}
    }
}

/// Reads from `from` and queues what is to be forwarded, each chunk with its delivery time.
async fn pump(st: &State, dir: Direction, from: &TcpStream, to: mpsc::UnboundedSender<Msg>, doomed: &AtomicBool) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if from.readable().await.is_err() {
            return;
        }
        let n = match from.try_read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => continue,
            Err(_) => return,
        };
        if st.black_hole.load(SeqCst) {
            st.holed.fetch_add(n, SeqCst);
            continue;
        }
        let at = Instant::now() + st.latency(dir);
        let (forward, close) = st.decide(dir, &buf[..n], doomed);
        if forward > 0 && to.send(Msg::Data(at, buf[..forward].to_vec())).is_err() {
            return;
        }
        if close {
            let _ = to.send(Msg::Close(at));
            // The deliverer ends the connection once what came before the cut is written.
            std::future::pending::<()>().await;
        }
    }
}

/// Writes queued chunks to `to`, each at its delivery time.
async fn deliver(st: &State, to: &TcpStream, mut rx: mpsc::UnboundedReceiver<Msg>) {
    while let Some(msg) = rx.recv().await {
        match msg {
            Msg::Data(at, bytes) => {
                tokio::time::sleep_until(at).await;
                if st.black_hole.load(SeqCst) {
                    st.holed.fetch_add(bytes.len(), SeqCst);
                    continue;
                }
                if write_all(to, &bytes).await.is_err() {
                    return;
                }
            }
            Msg::Close(at) => {
                tokio::time::sleep_until(at).await;
                return;
            }
        }
    }
}

async fn write_all(to: &TcpStream, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() {
        to.writable().await?;
        match to.try_write(bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
