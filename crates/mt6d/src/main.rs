//! `mt6d`: the Moving Target IPv6 Defense gateway.
//!
//! One binary with subcommands: the daemon (`run`), its config checker (`check`), its status
//! client (`status`), the zero-configuration lab (`demo`), and helpers for keys and debugging.
//! Protocol rules live in `mt6d-proto`; every kernel interaction lives in `mt6d-os`.

use mt6d::{config, control, gateway, keys, lab};

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

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the gateway daemon with a configuration file (root, or a user with CAP_NET_ADMIN and
    /// CAP_NET_RAW).
    ///
    /// Stops cleanly on SIGTERM, SIGINT, SIGQUIT, SIGXCPU or SIGPWR, removing every address,
    /// route, neighbour entry and device it created and restoring the sysctls it changed.
    /// SIGHUP re-reads the file: an
    /// invalid one is logged (file:line:column) and changes nothing; changes to peers or
    /// interfaces are logged and need a restart. SIGPIPE, SIGUSR1/2, SIGALRM and the other
    /// signals that would end it otherwise are ignored. Fails closed: if the process dies
    /// without clean-up, guard routes keep the protected hosts' packets off the external
    /// interface until `mt6d down` or the next start.
    Run {
        /// Configuration file (TOML; see docs/CONFIG.md).
        #[arg(short, long, value_name = "FILE")]
        config: PathBuf,
        /// error, warn, info, debug, trace or off; overrides RUST_LOG and the config's
        /// `log_level` (default info).
        #[arg(long, value_name = "LEVEL", value_parser = parse_level)]
        log_level: Option<log::LevelFilter>,
    },
    /// Remove what a dead daemon left (after SIGKILL, a crash or OOM); starts nothing.
    ///
    /// Removes the guard routes, routes, proxy neighbour entries and hashed addresses the
    /// daemon for this configuration (in this network namespace) left, and its record in
    /// /run/mt6d, and restores the sysctls it changed to the values found before it first
    /// changed them. Refuses while that daemon is running: stop it with SIGTERM instead, which
    /// cleans up itself.
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
    /// Ask a running daemon for its epochs, addresses, ports and counters.
    Status {
        /// Control socket of the daemon (default: the one named by --config, else /run/mt6d/mt6d0.sock).
        #[arg(short, long, value_name = "PATH")]
        socket: Option<PathBuf>,
        /// Read the control socket path from this configuration file.
        #[arg(short, long, value_name = "FILE", conflicts_with = "socket")]
        config: Option<PathBuf>,
        /// Print the status as JSON.
        #[arg(long)]
        json: bool,
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
        Command::Run { config, .. } => gateway::run(&config),
        Command::Down { config } => gateway::down(&config),
        Command::Check { config } => check(&config),
        Command::Status {
            socket,
            config,
            json,
        } => match status(socket, config, json) {
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

fn check(path: &std::path::Path) -> CliResult {
    let cfg = config::Config::load(path)?;
    let g = &cfg.gateway;
    println!("{}: OK", path.display());
    let role = match &g.role {
        config::Role::Gateway { internal_interface } => {
            format!("gateway: internal {internal_interface}")
        }
        config::Role::Host { local_host } => {
            format!("host: {local_host} on the TUN device")
        }
    };
    println!(
        "  {role}  external {}  tun {}  control socket {}",
        g.external_interface,
        g.tun_name,
        g.control_socket.display()
    );
    for p in &cfg.peers {
        let s = &p.stream;
        let keying = match &p.keying {
            config::Keying::Handshake(h) => format!(
                "handshake with {} (rekey every {:?})",
                keys::public_key_text(&h.remote_public),
                h.rekey_after
            ),
            config::Keying::PreShared => "pre-shared session key".to_string(),
        };
        println!(
            "  peer {}: {} <-> {}  mode {}  aead {}  derivation {}  ports {:?}  rotation {:?}{}  keys: {keying}",
            p.name,
            s.local.true_addr,
            s.remote.true_addr,
            s.mode,
            s.aead,
            s.derivation,
            s.ports,
            s.rotation,
            if s.jitter { " (jittered)" } else { "" }
        );
    }
    Ok(())
}

fn status(socket: Option<PathBuf>, config: Option<PathBuf>, json: bool) -> CliResult {
    let path = match (socket, config) {
        (Some(s), _) => s,
        (None, Some(c)) => config::Config::load(&c)?.gateway.control_socket,
        (None, None) => config::default_control_socket("mt6d0"),
    };
    let st = control::query_status(&path)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&st)?);
    } else {
        print!("{}", control::render(&st));
    }
    Ok(())
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
    let now = gateway::clock::now();
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
