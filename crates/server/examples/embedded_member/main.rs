// One member of an embedded cairn cluster per program: three programs, each embedding a
// `cairn::Engine`, form one Raft cluster over cairn's peer transport. In three terminals:
//
//   M=m0=http://127.0.0.1:2380,m1=http://127.0.0.1:2480,m2=http://127.0.0.1:2580
//   cargo run -p cairn --example embedded_member -- m0 /tmp/cairn-m0 127.0.0.1:2380 $M
//   cargo run -p cairn --example embedded_member -- m1 /tmp/cairn-m1 127.0.0.1:2480 $M
//   cargo run -p cairn --example embedded_member -- m2 /tmp/cairn-m2 127.0.0.1:2580 $M
//
// The arguments: the member's name, its data directory, the address it listens on for peers,
// and the member list (etcd's `--initial-cluster`); `--serve-etcd HOST:PORT` after them also
// serves the etcd v3 API (etcdctl, any etcd client) for this member's engine. Each member
// prints the leadership changes it sees (`[m1] term 2: m0 leads`) and answers commands typed
// on its standard input, one line each:
//
//   put K V   writes K; on a follower the engine forwards the write to the leader
//   get K     reads K, linearizably, on this member
//   leader    who leads at which term, as this member sees it
//   quit      hands leadership over if this member leads, stops the engine, exits
//             (so do the end of the input and Ctrl-C)
//
// Kill the leader's program (Ctrl-\ or kill -9) and the other two elect a new leader and say
// so; writes go on through either. Remove the data directories to start a new cluster.
//
//   cargo run -p cairn --example embedded_member -- --demo
//
// runs that by itself (demo.rs): three copies of this program as child processes, driven over
// their standard input and output; it kills the leader with SIGKILL, checks that the survivors
// announce a new leader and that a write on a follower is read on every member, and exits
// non-zero on any failure, in about five seconds. `cargo xtask ci` runs it right after its
// `cargo test --workspace`, which builds every example: the phase runs that binary and compiles
// nothing (`cargo run -p cairn` would resolve one package's features, not the workspace's, and
// rebuild much of the tree). A mode of the example rather than a test in `tests/it`: such a
// test would need the example binary, which `cargo test --test it` does not build, and this is
// the command a person runs.
//
// Serving the etcd API needs the `server` feature (on by default); the engines alone do not.
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use cairn::kv::{PutRequest, RangeRequest};
use cairn::{Engine, ServeConfig};

#[path = "../common/mod.rs"]
mod common;
mod demo;
use common::BoxError;

const USAGE: &str = "usage: embedded_member NAME DATA_DIR PEER_LISTEN_ADDR \
                     NAME=PEER_URL,... [--serve-etcd HOST:PORT] | embedded_member --demo";

/// How long `quit` waits for another member to take over leadership.
const HANDOVER: Duration = Duration::from_secs(2);

/// One member's arguments.
#[derive(Debug)]
struct Args {
    name: String,
    data_dir: PathBuf,
    listen_peer: String,
    members: String,
    serve: Option<SocketAddr>,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.as_slice() {
        [demo] if demo == "--demo" => demo::run(),
        _ => parse(&args).and_then(|args| {
            let runtime = tokio::runtime::Runtime::new()?;
            runtime.block_on(member(args))
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("embedded_member: {e}");
            ExitCode::FAILURE
        }
    }
}

fn parse(args: &[String]) -> Result<Args, BoxError> {
    let (serve, rest) = match args {
        [rest @ .., flag, addr] if flag == "--serve-etcd" => (Some(addr.parse()?), rest),
        rest => (None, rest),
    };
    match rest {
        [name, data_dir, listen_peer, members] => Ok(Args {
            name: name.clone(),
            data_dir: data_dir.into(),
            listen_peer: listen_peer.clone(),
            members: members.clone(),
            serve,
        }),
        _ => Err(USAGE.into()),
    }
}

/// This program's member of the cluster: its engine, and the names of all members by id.
struct Member {
    engine: Arc<Engine>,
    names: Arc<BTreeMap<u64, String>>,
}

/// Runs one member until `quit`, the end of the input, or Ctrl-C.
async fn member(args: Args) -> Result<(), BoxError> {
    let cfg = common::member_config(
        &args.name,
        args.data_dir,
        &args.members,
        &args.listen_peer,
        args.serve,
    )?;
    let names = common::member_names(&cfg);
    // Opening replays the log (quick for a new directory) and blocks meanwhile.
    let engine = Arc::new(tokio::task::spawn_blocking(move || Engine::open(cfg)).await??);
    let announcer = common::announce(args.name.clone(), &engine, names.clone());
    let mut server = args.serve.map(|addr| {
        let cfg = ServeConfig::new(engine.config().clone(), vec![format!("http://{addr}")]);
        println!("[{}] serves the etcd API: etcdctl --endpoints={addr} get --prefix ''", args.name);
        // Serving ends by itself when the engine stops.
        tokio::spawn(cairn::serve_engine(engine.clone(), cfg, std::future::pending()))
    });
    let me = Member { engine, names };
    let mut commands = stdin_lines();
    loop {
        tokio::select! {
            line = commands.recv() => match line {
                Some(line) => match line.trim() {
                    "" => continue,
                    "quit" => break,
                    command => println!("{}", me.answer(command).await),
                },
                None => break,
            },
            _ = tokio::signal::ctrl_c() => break,
            served = ended(&mut server) => {
                println!("error: serving the etcd API ended: {served:?}");
                break;
            }
        }
    }
    println!("{}", me.quit().await);
    announcer.await?;
    if let Some(server) = server {
        server.await??;
    }
    Ok(())
}

/// Standard input's lines, read on a thread of their own: a read in progress holds up nothing
/// (the thread dies with the process).
fn stdin_lines() -> tokio::sync::mpsc::Receiver<String> {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let Ok(line) = line else { break };
            if tx.blocking_send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Resolves when the etcd API server ends (never without one), with how it ended.
async fn ended(
    server: &mut Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
) -> Result<anyhow::Result<()>, tokio::task::JoinError> {
    match server {
        Some(handle) => {
            let result = handle.await;
            *server = None;
            result
        }
        None => std::future::pending().await,
    }
}

impl Member {
    fn name(&self, id: u64) -> String {
        common::name_of(&self.names, id)
    }

    /// The one-line answer to a command other than `quit`.
    async fn answer(&self, command: &str) -> String {
        let words: Vec<&str> = command.split_whitespace().collect();
        match words.as_slice() {
            ["put", key, value @ ..] if !value.is_empty() => self.put(key, &value.join(" ")).await,
            ["get", key] => self.get(key).await,
            ["leader"] => self.leader(),
            _ => "error: commands are put K V, get K, leader, quit".into(),
        }
    }

    async fn put(&self, key: &str, value: &str) -> String {
        let me = self.engine.identity().1;
        match self.engine.put(PutRequest::new(key.to_string(), value.to_string())).await {
            Ok(put) => {
                // The leader as of the answer (the engine publishes it before answering): the
                // one that took the write, or one elected since.
                let how = match self.engine.leader() {
                    Some(id) if id == me => "written here, on the leader".to_string(),
                    Some(id) => format!("forwarded to the leader, {}", self.name(id)),
                    None => "no leader now".to_string(),
                };
                format!("ok: put {key} at revision {} ({how})", put.revision)
            }
            Err(e) => format!("error: put {key}: {e}"),
        }
    }

    async fn get(&self, key: &str) -> String {
        let req = RangeRequest { key: key.to_string().into(), ..RangeRequest::default() };
        match self.engine.range(req).await {
            Ok(read) => match read.kvs.first() {
                Some(kv) => format!(
                    "ok: {key} = {} at revision {}",
                    String::from_utf8_lossy(&kv.value),
                    read.revision
                ),
                None => format!("ok: {key} is not set at revision {}", read.revision),
            },
            Err(e) => format!("error: get {key}: {e}"),
        }
    }

    fn leader(&self) -> String {
        let term = self.engine.raft_term();
        match self.engine.leader() {
            Some(id) if id == self.engine.identity().1 => {
                format!("ok: term {term}: {} leads (this member)", self.name(id))
            }
            Some(id) => format!("ok: term {term}: {} leads", self.name(id)),
            None => format!("ok: term {term}: no leader"),
        }
    }

    /// Hands leadership over if this member leads (a few seconds at most: with no other member
    /// up, none takes it), then stops the engine.
    async fn quit(&self) -> String {
        let me = self.engine.identity().1;
        let handover = match self.engine.leader() {
            Some(id) if id == me => {
                match tokio::time::timeout(HANDOVER, self.engine.hand_over_leadership()).await {
                    Ok(Ok(())) => match self.engine.leader() {
                        Some(next) => format!("handed leadership to {}", self.name(next)),
                        None => "handed leadership over".to_string(),
                    },
                    Ok(Err(e)) => format!("no handover: {e}"),
                    Err(_) => format!("no member took leadership within {HANDOVER:?}"),
                }
            }
            _ => "not the leader".to_string(),
        };
        let engine = self.engine.clone();
        match tokio::task::spawn_blocking(move || engine.stop()).await {
            Ok(()) => format!("ok: stopped ({handover})"),
            Err(e) => format!("error: stopping: {e}"),
        }
    }
}
