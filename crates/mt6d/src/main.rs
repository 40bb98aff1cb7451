//! `mt6d`: the Moving Target IPv6 Defense gateway.
//!
//! One binary with subcommands: the daemon (`run`), its config checker (`check`), its status
//! client (`status`), the zero-configuration lab (`demo`), and helpers for keys and debugging.
//! Protocol rules live in `mt6d-proto`; every kernel interaction lives in `mt6d-os`.

#![forbid(unsafe_code)]

use mt6d::daemon::Role;
use mt6d::{config, control, gateway, keys};
use mt6d_lab as lab;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "mt6d",
    version,
    about = "Moving Target IPv6 Defense: carry two hosts' IPv6 traffic between rotating hashed addresses",
    long_about = "Moving Target IPv6 Defense (MT6D).\n\n\
Two gateways in front of two protected hosts derive, from a shared key and the clock, a new pair \
of \"hashed\" IPv6 addresses (and UDP ports) every few seconds. They carry the hosts' packets \
between those addresses in UDP, with the hosts' own addresses removed and the rest encrypted, \
and restore them on the other side. Sessions survive every rotation.\n\n\
Start with `mt6d demo` (as root): it builds its own lab in network namespaces and shows it working."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Which daemon a client command talks to.
#[derive(clap::Args, Debug, Clone)]
struct Target {
    /// Control socket of the daemon.
    #[arg(short, long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Read the control socket path from this configuration file.
    #[arg(short, long, value_name = "FILE", conflicts_with = "socket")]
    config: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
enum PeerAction {
    /// Add a peer: NAME and the [[peer]] settings of docs/CONFIG.md as options (at least
    /// --local-host, --remote-host, and --public-key or --key-file). Runtime only: the
    /// configuration file is not written.
    Add {
        /// The peer's name, unique among the daemon's peers.
        name: String,
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        fields: PeerFields,
    },
    /// Change settings of peer NAME (its session restarts; the other peers carry on). Runtime
    /// only: the configuration file is not written.
    Set {
        name: String,
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        fields: PeerFields,
        /// Remove this setting from the peer first (e.g. `--unset key_file --public-key K`);
        /// repeatable.
        #[arg(long, value_name = "KEY")]
        unset: Vec<String>,
    },
    /// Remove the peers named, together (all or none). Runtime only: the configuration file
    /// is not written.
    Remove {
        #[arg(required = true, value_name = "NAME")]
        names: Vec<String>,
        #[command(flatten)]
        target: Target,
    },
}

/// A [[peer]]'s settings as options; each is the configuration key of the same name
/// (docs/CONFIG.md). There is no option for an inline `key`: a secret on a command line is
/// visible to every user of the machine; use --key-file.
#[derive(clap::Args, Debug, Clone, Default)]
struct PeerFields {
    /// The protected host on this side (local_host).
    #[arg(long, value_name = "ADDR")]
    local_host: Option<String>,
    /// The protected host behind the peer (remote_host).
    #[arg(long, value_name = "ADDR")]
    remote_host: Option<String>,
    /// The peer gateway's identity public key, base64 (public_key).
    #[arg(long, value_name = "KEY")]
    public_key: Option<String>,
    /// A pre-shared session key file instead of a handshake (key_file).
    #[arg(long, value_name = "FILE")]
    key_file: Option<PathBuf>,
    /// An extra pre-shared key mixed into the handshake (preshared_key_file).
    #[arg(long, value_name = "FILE")]
    preshared_key_file: Option<PathBuf>,
    #[arg(long, value_name = "PREFIX")]
    local_prefix: Option<String>,
    #[arg(long, value_name = "PREFIX")]
    remote_prefix: Option<String>,
    #[arg(long, value_name = "MAC")]
    local_mac: Option<String>,
    #[arg(long, value_name = "MAC")]
    remote_mac: Option<String>,
    /// encrypt, auth or plain.
    #[arg(long, value_name = "MODE")]
    mode: Option<String>,
    #[arg(long, value_name = "AEAD")]
    aead: Option<String>,
    #[arg(long, value_name = "DERIVATION")]
    derivation: Option<String>,
    /// `hopping` or a fixed port number.
    #[arg(long, value_name = "PORT")]
    port: Option<String>,
    #[arg(long, value_name = "SECS")]
    rotation_secs: Option<f64>,
    #[arg(long, value_name = "BOOL")]
    jitter: Option<bool>,
}

impl PeerFields {
    /// The settings as a `[[peer]]` table; relative key file paths are made absolute here,
    /// against the directory the command runs in, which is what a person typing them means.
    fn table(&self) -> Result<toml::Table, String> {
        use toml::Value;
        let mut t = toml::Table::new();
        let text = [
            ("local_host", &self.local_host),
            ("remote_host", &self.remote_host),
            ("public_key", &self.public_key),
            ("local_prefix", &self.local_prefix),
            ("remote_prefix", &self.remote_prefix),
            ("local_mac", &self.local_mac),
            ("remote_mac", &self.remote_mac),
            ("mode", &self.mode),
            ("aead", &self.aead),
            ("derivation", &self.derivation),
        ];
        for (k, v) in text {
            if let Some(v) = v {
                t.insert(k.into(), Value::String(v.clone()));
            }
        }
        for (k, v) in [
            ("key_file", &self.key_file),
            ("preshared_key_file", &self.preshared_key_file),
        ] {
            if let Some(path) = v {
                let abs = std::path::absolute(path)
                    .map_err(|e| format!("--{}: {}: {e}", k.replace('_', "-"), path.display()))?;
                let Some(s) = abs.to_str() else {
                    return Err(format!(
                        "--{}: {} is not UTF-8",
                        k.replace('_', "-"),
                        abs.display()
                    ));
                };
                t.insert(k.into(), Value::String(s.to_owned()));
            }
        }
        if let Some(p) = &self.port {
            // The file's forms: "hopping" or a number (the daemon checks the range).
            let v = p
                .parse::<i64>()
                .map_or_else(|_| Value::String(p.clone()), Value::Integer);
            t.insert("port".into(), v);
        }
        if let Some(r) = self.rotation_secs {
            t.insert("rotation_secs".into(), Value::Float(r));
        }
        if let Some(j) = self.jitter {
            t.insert("jitter".into(), Value::Boolean(j));
        }
        Ok(t)
    }
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the gateway daemon with a configuration file (root, or a user with CAP_NET_ADMIN and
    /// CAP_NET_RAW).
    ///
    /// A file with a [server] table instead of [gateway] runs the server role: one daemon for
    /// the many clients of its peers file, each on hashed addresses of its own from one AnyIP
    /// /64 (docs/CONFIG.md "The server role"); SIGHUP re-reads its peers file. A file with a
    /// [relay] table runs one node of a relay network: a relay, an edge gateway, or both
    /// (docs/CONFIG.md "The relay role").
    ///
    /// Stops cleanly on SIGTERM, SIGINT, SIGQUIT, SIGXCPU or SIGPWR, removing every address,
    /// route, neighbour entry and device it created and restoring the sysctls it changed, but
    /// the fail-closed guard routes: they keep the protected side's packets off the external
    /// interface until the next start adopts them or `mt6d down` lifts them.
    /// SIGHUP re-reads the file (as `mt6d reload` does): an invalid one is logged
    /// (file:line:column) and changes nothing; peers added, removed or changed are applied
    /// live, all or nothing; a changed [gateway] section is refused whole and needs a restart.
    /// `mt6d peer` changes peers live without the file. SIGPIPE, SIGUSR1/2, SIGALRM and the other
    /// signals that would end it otherwise are ignored. Fails closed: if the process dies
    /// without clean-up, or stops, guard routes keep the protected hosts' packets off the
    /// external interface until `mt6d down` or the next start.
    Run {
        /// Configuration file (TOML; see docs/CONFIG.md).
        #[arg(short, long, value_name = "FILE")]
        config: PathBuf,
        /// error, warn, info, debug, trace or off; overrides RUST_LOG and the config's
        /// `log_level` (default info).
        #[arg(long, value_name = "LEVEL", value_parser = parse_level)]
        log_level: Option<log::LevelFilter>,
    },
    /// Remove what a stopped daemon (its guard routes) or a dead one (after SIGKILL, a crash or
    /// OOM) left; starts nothing.
    ///
    /// Removes the guard routes, routes, proxy neighbour entries and hashed addresses the
    /// daemon for this configuration (in this network namespace) left, and its record in
    /// /run/mt6d, and restores the sysctls it changed to the values found before it first
    /// changed them. Lifting the guards lets the protected side's packets take whatever route
    /// the system has without mt6d. Refuses while that daemon is running: stop it first.
    Down {
        /// Configuration file the dead daemon ran with.
        #[arg(short, long, value_name = "FILE")]
        config: PathBuf,
    },
    /// Validate a configuration file and print what the daemon would set up; changes nothing.
    Check {
        #[arg(short, long, value_name = "FILE")]
        config: PathBuf,
    },
    /// Ask running daemons for their epochs, addresses, ports and counters: every daemon of
    /// the machine (found by its record under /run/mt6d, or MT6D_STATE_DIR), or the one named
    /// by --socket or --config.
    ///
    /// With --json and no daemon named, the answer is a list with one object per daemon
    /// (`pid`, `config`, `control_socket`, and `status` or `error`).
    Status {
        #[command(flatten)]
        target: Target,
        /// Print the status as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Make a running daemon re-read its configuration file, as SIGHUP does, and say what
    /// changed: peers added, removed or changed are applied all or nothing, without a lost
    /// packet for the others; an invalid file or a changed [gateway] section changes nothing
    /// and the error says why. Changes made with `mt6d peer` and not written in the file are
    /// undone. A server re-reads its peers file. A relay node applies its [[relay.link]]
    /// tables added, removed or changed, and refuses (naming the keys, changing nothing) a
    /// change to [relay] settings or [[relay.e2e]] peers.
    Reload {
        #[command(flatten)]
        target: Target,
    },
    /// Add, change or remove a peer of a running daemon, without a restart and without a lost
    /// packet for the other peers.
    ///
    /// Runtime only, as `wg set` is: the configuration file is not written, so the change
    /// lasts until the next SIGHUP, `mt6d reload` or restart, which make the daemon match the
    /// file again. To keep a change, write the same [[peer]] in the file too.
    ///
    /// The change is validated exactly as the file is, together with every running peer, and
    /// refused whole if anything is wrong (the error names the peer and the setting); a change
    /// to [gateway] settings is not possible here. Only root and the daemon's user may use the
    /// control socket.
    Peer {
        // Boxed: the options of `peer add` outweigh every other command's.
        #[command(subcommand)]
        action: Box<PeerAction>,
    },
    /// Build a lab in network namespaces (two hosts, two gateways, a public link), run real
    /// traffic through MT6D across several rotations, print what an observer saw, and clean up.
    Demo(lab::demo::DemoArgs),
    /// Create a gateway identity: a new X25519 private key written base64 to FILE (created with
    /// mode 0600, never overwritten); prints its public key for the peer's `public_key`.
    /// FILE `-` prints the private key to standard output instead (`mt6d keygen - | mt6d pubkey`).
    Keygen {
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
    /// Print the public key (base64) of a private key file, or of a private key on standard
    /// input when FILE is `-` or missing.
    Pubkey {
        #[arg(value_name = "FILE")]
        file: Option<PathBuf>,
    },
    /// Print a new random 256-bit key (base64), or write it to a file created with mode 0600:
    /// a [[peer]] `preshared_key_file` mixed into the handshake, or a pre-shared session key
    /// (`key`/`key_file`) for the thesis-compatible mode without handshakes.
    Genpsk {
        /// Write the key to this file (mode 0600) instead of standard output.
        #[arg(short, long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Reproduce the thesis evaluation (000 Ch. 4-5) side by side with no tunnel, wireguard-go
    /// and boringtun: runs the `mt6d-bench` program installed next to `mt6d` with these arguments
    /// (`mt6d bench --help` for its options).
    #[command(disable_help_flag = true)]
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Print a shell completion script to standard output, e.g.
    /// `mt6d completions bash > /usr/share/bash-completion/completions/mt6d`
    /// (zsh: `_mt6d` in a directory of `$fpath`; fish: `~/.config/fish/completions/mt6d.fish`).
    Completions {
        #[arg(value_enum, value_name = "SHELL")]
        shell: clap_complete::Shell,
    },
    /// Write the manual pages, mt6d.1 and mt6d-SUBCOMMAND.1, generated from this help, into DIR
    /// (e.g. /usr/share/man/man1).
    Man {
        #[arg(long, value_name = "DIR", default_value = ".")]
        out: PathBuf,
    },
    /// Debugging: print the hashed routes (addresses and ports) of each peer for a few epochs
    /// around now, as both gateways compute them. Needs no root and touches nothing.
    Routes {
        #[arg(short, long, value_name = "FILE")]
        config: PathBuf,
        /// Epochs before and after the current one to print.
        #[arg(long, default_value_t = 2)]
        around: u64,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&cli.command);
    let result = match cli.command {
        Command::Run { config, .. } => role_of(&config).run(&config),
        Command::Down { config } => role_of(&config).down(&config),
        Command::Check { config } => role_of(&config).check(&config).map(|text| print!("{text}")),
        Command::Reload { target } => reload(&target),
        Command::Peer { action } => peer(*action),
        Command::Status { target, json } => match status(target, json) {
            // A script asking for JSON gets JSON on failure too (daemon not running, ...).
            Err(e) if json => {
                println!("{}", serde_json::json!({ "error": e.to_string() }));
                return ExitCode::FAILURE;
            }
            r => r,
        },
        Command::Demo(args) => lab::demo::run(args),
        Command::Genpsk { out } => genpsk(out),
        Command::Keygen { file } => keygen(&file),
        Command::Pubkey { file } => pubkey(file),
        Command::Routes { config, around } => routes(&config, around),
        Command::Bench { args } => bench(args),
        Command::Completions { shell } => {
            completions(shell, &mut std::io::stdout());
            Ok(())
        }
        Command::Man { out } => man(&out),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mt6d: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn parse_level(s: &str) -> Result<log::LevelFilter, String> {
    config::parse_log_level(s)
        .ok_or_else(|| format!("{s:?}: one of error, warn, info, debug, trace, off"))
}

/// The log filter: `mt6d run --log-level`, else `RUST_LOG`, else the config's `log_level`,
/// else info (docs/CONFIG.md).
fn init_logging(command: &Command) {
    let mut builder = env_logger::Builder::from_env(env_logger::Env::default());
    builder.format_target(false);
    let flag = match command {
        Command::Run { log_level, .. } => *log_level,
        _ => None,
    };
    let from_config = || match command {
        // Loaded again by `run`, which reports its errors; here only the level matters.
        Command::Run { config, .. } if is_server_file(config) => config::ServerConfig::load(config)
            .ok()
            .and_then(|c| c.log_level),
        Command::Run { config, .. } if is_relay_file(config) => config::RelayConfig::load(config)
            .ok()
            .and_then(|c| c.log_level),
        Command::Run { config, .. } => config::Config::load(config)
            .ok()
            .and_then(|c| c.gateway.log_level),
        _ => None,
    };
    match flag {
        Some(level) => {
            builder.filter_level(level);
        }
        None if std::env::var_os("RUST_LOG").is_some() => {}
        None => {
            builder.filter_level(from_config().unwrap_or(log::LevelFilter::Info));
        }
    }
    builder.init();
}

/// Errors of the command-line layer: each wraps the layer below with what was being done.
type CliResult = Result<(), Box<dyn std::error::Error>>;

/// The role a configuration file is for: a `[server]` table makes it a server's, a `[relay]`
/// table a relay node's, anything else a gateway's or host's (whose loader reports a file it
/// cannot read).
fn role_of(path: &std::path::Path) -> &'static dyn Role {
    if is_server_file(path) {
        &mt6d::server::Server
    } else if is_relay_file(path) {
        &mt6d::relay::Relay
    } else {
        &gateway::Gateway
    }
}

/// Whether `path` holds a server role configuration (a `[server]` table). An unreadable file
/// is not: the gateway's loader then reports why it cannot be read.
fn is_server_file(path: &std::path::Path) -> bool {
    std::fs::read_to_string(path).is_ok_and(|t| config::ServerConfig::is_server_file(&t))
}

/// Whether `path` holds a relay node's configuration (a `[relay]` table).
fn is_relay_file(path: &std::path::Path) -> bool {
    std::fs::read_to_string(path).is_ok_and(|t| config::RelayConfig::is_relay_file(&t))
}

/// The control socket `target` names, if it names one.
fn named_socket(target: &Target) -> Result<Option<PathBuf>, Box<dyn std::error::Error>> {
    Ok(match (&target.socket, &target.config) {
        (Some(s), _) => Some(s.clone()),
        (None, Some(c)) => {
            let text = std::fs::read_to_string(c).map_err(|e| format!("{}: {e}", c.display()))?;
            if config::ServerConfig::is_server_file(&text) {
                Some(config::ServerConfig::load(c)?.control_socket)
            } else if config::RelayConfig::is_relay_file(&text) {
                Some(config::RelayConfig::load(c)?.control_socket)
            } else {
                Some(config::Config::load(c)?.gateway.control_socket)
            }
        }
        (None, None) => None,
    })
}

/// The control socket of the one daemon a command means: the one named, else the only one
/// running; several running is an error that lists them.
fn one_socket(target: &Target) -> Result<PathBuf, Box<dyn std::error::Error>> {
    if let Some(s) = named_socket(target)? {
        return Ok(s);
    }
    let dir = gateway::state::state_dir();
    let running = gateway::state::running_instances(&dir);
    match running.as_slice() {
        [(only, _)] => Ok(only.control_socket.clone()),
        [] => Err(format!(
            "no running mt6d has a record in {}; name its control socket with --socket or its configuration with --config",
            dir.display()
        )
        .into()),
        many => Err(format!(
            "{} daemons are running; name one with --socket or --config: {}",
            many.len(),
            many.iter()
                .map(|(r, pid)| format!(
                    "pid {pid} ({}, control socket {})",
                    r.config.display(),
                    r.control_socket.display()
                ))
                .collect::<Vec<_>>()
                .join("; ")
        )
        .into()),
    }
}

fn status(target: Target, json: bool) -> CliResult {
    if let Some(path) = named_socket(&target)? {
        match control::query_any_status(&path)? {
            control::AnyStatus::Gateway(st) if json => {
                println!("{}", serde_json::to_string_pretty(&st)?)
            }
            control::AnyStatus::Gateway(st) => print!("{}", mt6d::status::text::render(&st)),
            control::AnyStatus::Server(st) if json => {
                println!("{}", serde_json::to_string_pretty(&st)?)
            }
            control::AnyStatus::Server(st) => print!("{}", mt6d::status::server::render(&st)),
            control::AnyStatus::Relay(st) if json => {
                println!("{}", serde_json::to_string_pretty(&st)?)
            }
            control::AnyStatus::Relay(st) => print!("{}", mt6d::status::relay::render(&st)),
        }
        return Ok(());
    }
    // No daemon named: every daemon of the machine, by the records they keep.
    let dir = gateway::state::state_dir();
    let running = gateway::state::running_instances(&dir);
    if running.is_empty() {
        return Err(format!(
            "no running mt6d has a record in {} (a daemon started with another MT6D_STATE_DIR: set it, or name the daemon's --socket)",
            dir.display()
        )
        .into());
    }
    let mut listed = Vec::new();
    let mut failed = 0;
    for (i, (record, pid)) in running.iter().enumerate() {
        let answer = control::query_status(&record.control_socket);
        failed += usize::from(answer.is_err());
        if json {
            let mut entry = serde_json::json!({
                "pid": pid,
                "config": record.config,
                "control_socket": record.control_socket,
            });
            entry[if answer.is_ok() { "status" } else { "error" }] = match &answer {
                Ok(st) => serde_json::to_value(st)?,
                Err(e) => serde_json::Value::String(e.to_string()),
            };
            listed.push(entry);
            continue;
        }
        if i > 0 {
            println!();
        }
        println!(
            "== mt6d pid {pid}: {} (control socket {})",
            record.config.display(),
            record.control_socket.display()
        );
        match answer {
            Ok(st) => print!("{}", mt6d::status::text::render(&st)),
            Err(e) => println!("no answer: {e}"),
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&listed)?);
    }
    if failed > 0 {
        return Err(format!("{failed} of {} daemons did not answer", running.len()).into());
    }
    Ok(())
}

fn reload(target: &Target) -> CliResult {
    let socket = one_socket(target)?;
    let answer = control::send(&socket, &control::Request::Reload)?;
    print_change(
        &answer,
        "the configuration file is unchanged since the daemon read it",
    );
    Ok(())
}

fn peer(action: PeerAction) -> CliResult {
    let (target, edits) = match action {
        PeerAction::Add {
            name,
            target,
            fields,
        } => {
            let mut peer = toml::Table::new();
            peer.insert("name".into(), toml::Value::String(name));
            peer.extend(fields.table()?);
            (target, vec![control::Edit::Add { peer }])
        }
        PeerAction::Set {
            name,
            target,
            fields,
            unset,
        } => {
            let fields = fields.table()?;
            if fields.is_empty() && unset.is_empty() {
                return Err(format!(
                    "peer set {name}: nothing to change (give settings as options, or --unset KEY)"
                )
                .into());
            }
            (
                target,
                vec![control::Edit::Set {
                    name,
                    fields,
                    unset,
                }],
            )
        }
        PeerAction::Remove { names, target } => (
            target,
            names
                .into_iter()
                .map(|name| control::Edit::Remove { name })
                .collect(),
        ),
    };
    let socket = one_socket(&target)?;
    let answer = control::send(&socket, &control::Request::Peers { edits })?;
    print_change(&answer, "the peer is already as asked");
    println!("runtime only: the configuration file was not written (the next reload or restart returns to it)");
    Ok(())
}

fn print_change(answer: &control::ChangeAnswer, same: &str) {
    let mut parts = Vec::new();
    for (what, names) in [
        ("added", &answer.added),
        ("removed", &answer.removed),
        ("changed", &answer.changed),
    ] {
        if !names.is_empty() {
            parts.push(format!("{what} {}", names.join(", ")));
        }
    }
    if parts.is_empty() {
        println!("nothing changed: {same}");
    } else {
        println!("{}", parts.join("; "));
    }
}

fn genpsk(out: Option<PathBuf>) -> CliResult {
    let text = keys::encode(keys::random32()?.as_slice());
    match out {
        None => println!("{}", text.as_str()),
        Some(path) => keys::write_secret_file(&path, &text)?,
    }
    Ok(())
}

fn keygen(file: &std::path::Path) -> CliResult {
    let private = keys::new_private_key()?;
    let text = keys::encode(private.to_bytes().as_slice());
    if file == std::path::Path::new("-") {
        println!("{}", text.as_str());
        return Ok(());
    }
    keys::write_secret_file(file, &text)?;
    eprintln!(
        "wrote {} (mode 0600); give this public key to the peer gateway's [[peer]] public_key:",
        file.display()
    );
    println!("{}", keys::public_key_text(&private.public_key()));
    Ok(())
}

fn pubkey(file: Option<PathBuf>) -> CliResult {
    let private = match file.filter(|f| f != std::path::Path::new("-")) {
        Some(f) => keys::read_private_key(&f)?,
        None => {
            let mut text = zeroize::Zeroizing::new(String::new());
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)?;
            let bytes = keys::decode32(&text, "private key on standard input", "private key")?;
            mt6d_proto::handshake::PrivateKey::from_bytes(*bytes)
        }
    };
    println!("{}", keys::public_key_text(&private.public_key()));
    Ok(())
}

fn bench(args: Vec<std::ffi::OsString>) -> CliResult {
    use std::os::unix::process::CommandExt as _;
    let exe = std::env::current_exe()?;
    let sibling = exe.with_file_name("mt6d-bench");
    if !sibling.exists() {
        return Err(format!(
            "{} not found: build it with `cargo build --release -p mt6d-bench` (it lives next to mt6d)",
            sibling.display()
        )
        .into());
    }
    // exec replaces this process, so signals and the exit code are the bench's own.
    let err = std::process::Command::new(&sibling).args(args).exec();
    Err(format!("{}: {err}", sibling.display()).into())
}

fn routes(path: &std::path::Path, around: u64) -> CliResult {
    let cfg = config::Config::load(path)?;
    let now = mt6d::daemon::clock::now();
    for p in &cfg.peers {
        let stream = p.build_stream()?;
        let current = stream.epoch_at(now);
        println!(
            "peer {} ({} <-> {})",
            p.name,
            stream.local_true(),
            stream.remote_true()
        );
        for e in current.0.saturating_sub(around)..=current.0 + around {
            let r = stream.route(mt6d_proto::Epoch(e));
            let mark = if e == current.0 { "*" } else { " " };
            println!("{mark} epoch {e}: local {}  remote {}", r.local, r.remote);
        }
    }
    Ok(())
}

fn completions(shell: clap_complete::Shell, out: &mut dyn std::io::Write) {
    clap_complete::generate(shell, &mut Cli::command(), "mt6d", out);
}

fn man(out: &std::path::Path) -> CliResult {
    std::fs::create_dir_all(out)
        .map_err(|e| format!("create manual page directory {}: {e}", out.display()))?;
    clap_mangen::generate_to(Cli::command(), out)
        .map_err(|e| format!("write manual pages into {}: {e}", out.display()))?;
    println!("wrote the manual pages into {}", out.display());
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    /// Every option of `mt6d peer add` and `peer set` is the `[[peer]]` key of the same name:
    /// a flag the configuration does not know would be refused by the daemon at run time.
    #[test]
    fn every_peer_option_is_a_peer_key() {
        let cli = Cli::command();
        let peer = cli.find_subcommand("peer").unwrap();
        let example = include_str!("../../../examples/gateway-a.toml");
        let mut checked = 0;
        for action in ["add", "set"] {
            let sub = peer.find_subcommand(action).unwrap();
            for arg in sub.get_arguments() {
                let Some(long) = arg.get_long() else {
                    continue;
                };
                // Which daemon to ask, and `set`'s own instruction: not peer settings.
                if ["socket", "config", "unset", "help"].contains(&long) {
                    continue;
                }
                let key = long.replace('-', "_");
                // The example's [[peer]] is its last table: the key joins it. Its value may
                // be of the wrong type; only an unknown key is what this test looks for.
                let text = format!("{example}\n{key} = \"x\"\n");
                if let Err(e) = config::Config::parse(std::path::Path::new("t.toml"), &text) {
                    let e = e.to_string();
                    assert!(
                        !e.contains("unknown field"),
                        "`mt6d peer {action} --{long}` names no [[peer]] key: {e}"
                    );
                }
                checked += 1;
            }
        }
        assert!(checked >= 2 * 15, "{checked} options checked");
    }

    /// The tables whose settings a command's options are, by the command's path: `run`'s
    /// override the node's own, `peer add`/`set` give a `[[peer]]`, `demo` writes its gateways'
    /// files (`[gateway]` and `[[peer]]`). Any other command has no setting among its options.
    const SETTING_TABLES: &[(&str, &[&str])] = &[
        ("run", &["gateway", "server", "relay"]),
        ("peer add", &["peer"]),
        ("peer set", &["peer"]),
        ("demo", &["gateway", "peer"]),
    ];

    /// Long options that are not configuration settings, and what each is instead.
    const NOT_SETTINGS: &[(&str, &str, &str)] = &[
        ("", "help", "clap's help"),
        ("", "version", "clap's version"),
        ("", "config", "names the configuration file itself"),
        (
            "",
            "socket",
            "names the control socket of the daemon to talk to",
        ),
        ("peer set", "unset", "names keys to remove, an instruction"),
        ("status", "json", "the output's format"),
        ("man", "out", "where the manual pages go"),
        ("routes", "around", "how many epochs to print"),
        ("genpsk", "out", "where the key goes"),
        ("demo", "json", "the output's format"),
        ("demo", "duration", "the length of each timed phase"),
        ("demo", "topology", "what the lab puts between the gateways"),
        ("demo", "flood", "the ping flood's count"),
        ("demo", "pcap", "the observer's capture file"),
        ("demo", "restart-gateway", "an experiment"),
        (
            "demo",
            "psk",
            "pre-shared keys (key_file) instead of handshakes (public_key)",
        ),
        (
            "demo",
            "host-mode",
            "role = \"host\" on one side: a lab topology",
        ),
        ("demo", "link-report", "an experiment"),
        ("demo", "link-pcap", "an experiment on an earlier capture"),
        ("demo", "past-router", "an experiment's filter"),
        (
            "demo",
            "conversations",
            "an experiment: how many host pairs talk at once",
        ),
        (
            "demo",
            "shapes",
            "an experiment: what the conversations carry",
        ),
        (
            "demo",
            "classifier",
            "an experiment: train the linker's classifier",
        ),
        ("demo", "link-out", "where an experiment's tables go"),
        (
            "demo",
            "link-keys",
            "an experiment: how its conversations are keyed",
        ),
    ];

    /// Every long option of every command either is the configuration key of the same name
    /// (`--rotation-secs` is `rotation_secs`) in a table that command's settings belong to, or
    /// is listed in NOT_SETTINGS with what it is instead: a flag and a key cannot drift apart,
    /// and a new option that is a setting must take the key's name. The keys are the parser's
    /// own ([`config::schema`]).
    #[test]
    fn every_option_that_is_a_setting_is_a_config_key() {
        fn walk(cmd: &clap::Command, path: &str, out: &mut Vec<(String, String)>) {
            for arg in cmd.get_arguments() {
                if let Some(long) = arg.get_long() {
                    out.push((path.to_owned(), long.to_owned()));
                }
            }
            for sub in cmd.get_subcommands() {
                let sub_path = format!("{path} {}", sub.get_name());
                walk(sub, sub_path.trim(), out);
            }
        }
        let mut options = Vec::new();
        walk(&Cli::command(), "", &mut options);
        let mut settings = 0;
        for (command, long) in &options {
            let key = long.replace('-', "_");
            let tables = SETTING_TABLES
                .iter()
                .find_map(|(c, t)| (c == command).then_some(*t))
                .unwrap_or(&[]);
            let is_key = tables.iter().any(|t| {
                config::schema::keys_of(t)
                    .unwrap_or_else(|| panic!("no table {t}"))
                    .contains(&key.as_str())
            });
            let exempt = NOT_SETTINGS
                .iter()
                .any(|(c, l, _)| l == long && (c.is_empty() || c == command));
            assert!(
                is_key || exempt,
                "`mt6d {command} --{long}` is no key of {tables:?}: name it after the configuration key it sets, or say in NOT_SETTINGS what it is"
            );
            assert!(
                !(is_key && exempt),
                "`mt6d {command} --{long}` is the key {key}, yet listed in NOT_SETTINGS"
            );
            settings += usize::from(is_key);
        }
        // Stale entries: every command-specific exemption names an option that exists.
        for (c, l, _) in NOT_SETTINGS.iter().filter(|(c, _, _)| !c.is_empty()) {
            assert!(
                options.iter().any(|(oc, ol)| oc == c && ol == l),
                "NOT_SETTINGS lists `mt6d {c} --{l}`, which does not exist"
            );
        }
        // run --log-level, 2 x 15 peer settings, demo --mode, --rotation-secs, --rekey-secs.
        assert!(settings >= 34, "{settings} settings checked");
    }

    /// `demo`'s options took their keys' names (`--rotation-secs`, `--rekey-secs`); the old
    /// names, in scripts and docs, still work.
    #[test]
    fn demo_options_keep_their_old_names_as_aliases() {
        for args in [
            ["mt6d", "demo", "--rotation", "3", "--rekey", "7"],
            ["mt6d", "demo", "--rotation-secs", "3", "--rekey-secs", "7"],
        ] {
            let Command::Demo(demo) = Cli::try_parse_from(args).unwrap().command else {
                panic!("{args:?} is not demo");
            };
            assert_eq!((demo.rotation, demo.rekey), (3.0, Some(7.0)), "{args:?}");
        }
    }

    #[test]
    fn completion_scripts_name_every_subcommand() {
        for shell in [
            clap_complete::Shell::Bash,
            clap_complete::Shell::Zsh,
            clap_complete::Shell::Fish,
        ] {
            let mut out = Vec::new();
            completions(shell, &mut out);
            let text = String::from_utf8(out).unwrap();
            for sub in [
                "run",
                "down",
                "check",
                "status",
                "demo",
                "keygen",
                "completions",
                "reload",
                "peer",
            ] {
                assert!(text.contains(sub), "{shell:?} completion lacks {sub}");
            }
        }
    }

    #[test]
    fn manual_pages_are_written_for_the_command_and_its_subcommands() {
        let dir = std::env::temp_dir().join(format!("mt6d-man-{}", std::process::id()));
        man(&dir).unwrap();
        let page = std::fs::read_to_string(dir.join("mt6d.1")).unwrap();
        assert!(page.contains("\n.TH mt6d 1 "), "{page:.200}");
        let run = std::fs::read_to_string(dir.join("mt6d-run.1")).unwrap();
        assert!(
            run.contains("SIGHUP"),
            "the run page carries the signal documentation"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
