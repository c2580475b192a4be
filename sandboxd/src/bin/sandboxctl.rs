//! `sandboxctl`: the command-line client. Talks to the daemon's Unix socket by
//! default, or to its HTTP listener with `--url`.

use clap::{CommandFactory, Parser, Subcommand};
use sandboxd::client::{Client, ClientError};
use sandboxd::download::{self, parse_size, printable, Budget, SaveDir};
use sandboxd::model::packages::{InstallRequest, InstallResult};
use sandboxd::model::run::{Language, RunRequest, RunResult, Status};
use sandboxd::model::secrets::{SecretPlace, SecretRequest};
use sandboxd::model::session::{CreateSessionRequest, Mode};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "sandboxctl", version, about = "Run code in sandboxd and manage its sessions and files")]
struct Cli {
    /// The daemon's Unix socket.
    #[arg(long, env = "SANDBOXD_SOCKET", default_value = "/run/sandboxd/sandboxd.sock", global = true)]
    socket: PathBuf,
    /// Talk to the daemon's HTTP listener instead, e.g. http://127.0.0.1:8181.
    #[arg(long, env = "SANDBOXD_URL", global = true)]
    url: Option<String>,
    /// Bearer token, when the daemon has tokens configured.
    #[arg(long, env = "SANDBOXD_TOKEN", global = true, hide_env_values = true)]
    token: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run Python (or, with --shell, a shell command) from FILE, or stdin with `-`.
    /// Prints the program's output as it would and exits with its exit code (73
    /// when --save could not save the run's files).
    ///
    /// Without --session the run gets a session of its own, which is closed once
    /// the run is over and --save has downloaded its files: nothing is left on the
    /// daemon. --keep keeps that session and prints its id on stderr.
    Run {
        /// File with the code; `-` or nothing reads stdin.
        file: Option<PathBuf>,
        /// Run in this session (files persist across its runs).
        #[arg(long)]
        session: Option<String>,
        /// Keep the session made for this run (without --session) instead of
        /// closing it; its id is printed on stderr.
        #[arg(long, conflicts_with = "session")]
        keep: bool,
        /// Wall-clock limit in seconds.
        #[arg(long)]
        timeout: Option<f64>,
        /// Policy for a new session.
        #[arg(long)]
        policy: Option<String>,
        /// Treat the code as a shell command.
        #[arg(long)]
        shell: bool,
        /// Print the whole run result as JSON instead.
        #[arg(long)]
        json: bool,
        /// Download the run's artifacts into this directory (made if missing). Files
        /// keep their holes (a sparse file stays sparse); names are kept below the
        /// directory, never through a symlink in it.
        #[arg(long)]
        save: Option<PathBuf>,
        /// Most bytes --save writes in all (file lengths; K, M, G suffixes): past
        /// it, nothing more is saved and the file being written is removed.
        #[arg(long, value_parser = parse_size, default_value = "1G")]
        max_bytes: u64,
        /// Do not save open matplotlib figures.
        #[arg(long)]
        no_figures: bool,
        /// Install this package into the session first (repeatable), e.g.
        /// --package requests==2.32.3.
        #[arg(long = "package", value_name = "REQUIREMENT")]
        packages: Vec<String>,
    },
    /// Install packages into a session's package layer (`pip install`), where its
    /// later runs import them.
    Pip {
        #[command(subcommand)]
        command: PipCommand,
    },
    /// A session's secrets: values its code uses through the egress proxy but never
    /// reads (it sees a placeholder).
    Secrets {
        #[command(subcommand)]
        command: SecretsCommand,
    },
    /// Manage sessions.
    Sessions {
        #[command(subcommand)]
        command: SessionsCommand,
    },
    /// Manage a session's files.
    Files {
        #[command(subcommand)]
        command: FilesCommand,
    },
    /// Check that the daemon is up.
    Health,
    /// Ask the daemon whether its host meets every requirement (kernel, Landlock,
    /// seccomp, user namespaces, cgroups, loop devices, free space, rootfs): prints
    /// each with ✓ / ! / ✗ and what to do; exits 1 when one is not met.
    Doctor,
    /// Serve sandboxd's MCP tools on stdin/stdout (for LM Studio, Claude Desktop, ...),
    /// forwarding to the daemon. Only protocol messages go to stdout.
    Mcp,
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions { shell: clap_complete::Shell },
}

#[derive(Subcommand)]
enum PipCommand {
    /// Install REQUIREMENTs (names, [extras], version specifiers) into --session's
    /// package layer. Exits 2 when the install failed (as for every error of the
    /// daemon), printing the installer's message.
    Install {
        /// The session whose package layer gets them (`sandboxctl sessions new` makes one).
        #[arg(long)]
        session: String,
        /// Requirements, e.g. tabulate==0.9.0 requests>=2 'pandas[excel]' (no URLs,
        /// paths or pip options; at most 32 with those of --requirement).
        #[arg(value_name = "REQUIREMENT", required_unless_present = "requirements")]
        packages: Vec<String>,
        /// Also install the requirements listed in FILE, one per line, as in pip's
        /// requirements files (`#` comments and blank lines skipped; no pip options
        /// such as -e, -r or --index-url; `-` reads stdin). Repeatable.
        #[arg(short = 'r', long = "requirement", value_name = "FILE")]
        requirements: Vec<std::path::PathBuf>,
        /// Print the whole answer as JSON instead.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum SecretsCommand {
    /// Set the session's secret NAME, its value read from stdin (first line), sent
    /// only to each --host, only in the request parts each --in names (default:
    /// headers).
    Set {
        session: String,
        name: String,
        #[arg(long = "host", required = true)]
        hosts: Vec<String>,
        /// headers, url or body (repeat for more than one).
        #[arg(long = "in", value_parser = ["headers", "url", "body"])]
        places: Vec<String>,
    },
    /// List the session's secrets (names and hosts; never a value).
    Ls { session: String },
    /// Forget the session's own secret NAME.
    Rm { session: String, name: String },
}

#[derive(Subcommand)]
enum SessionsCommand {
    /// List sessions.
    Ls,
    /// Create a session and print its id.
    New {
        #[arg(long)]
        id: Option<String>,
        #[arg(long)]
        policy: Option<String>,
        /// script or kernel.
        #[arg(long, value_parser = ["script", "kernel"])]
        mode: Option<String>,
        #[arg(long)]
        ttl: Option<u64>,
    },
    /// Show one session.
    Show { id: String },
    /// List a session's runs, newest first: id, status, language, when accepted,
    /// milliseconds taken.
    Runs {
        id: String,
        /// How many (1 to 100).
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// Only runs older than this run id (the last one printed).
        #[arg(long)]
        before: Option<String>,
    },
    /// Show one run of a session as JSON: its code, status, timestamps and result.
    Run { id: String, run_id: String },
    /// Close a session: kill its run and remove its files.
    Rm { id: String },
}

#[derive(Subcommand)]
enum FilesCommand {
    /// List a session's files.
    Ls { session: String },
    /// Download a file (to stdout, or to --output, which keeps its holes and is
    /// written whole or not at all). Exits 73 when it could not be written.
    Get {
        session: String,
        path: String,
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// Most bytes written (K, M, G suffixes); a larger file is refused.
        #[arg(long, value_parser = parse_size, default_value = "1G")]
        max_bytes: u64,
    },
    /// Upload a local file (or stdin with `-`) to PATH in the session.
    Put {
        session: String,
        local: PathBuf,
        path: String,
        #[arg(long)]
        overwrite: bool,
    },
    /// Delete a file.
    Rm { session: String, path: String },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Completions { shell } = cli.command {
        clap_complete::generate(shell, &mut Cli::command(), "sandboxctl", &mut std::io::stdout());
        return ExitCode::SUCCESS;
    }
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("sandboxctl: cannot start: {e}");
            return ExitCode::from(70);
        }
    };
    let client = Client::new(cli.socket.clone(), cli.url.clone(), cli.token.clone());
    if let Command::Mcp = cli.command {
        return match runtime.block_on(serve_mcp(client)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("sandboxctl mcp: {e}");
                ExitCode::from(69)
            }
        };
    }
    match runtime.block_on(dispatch(&client, cli.command)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sandboxctl: {e}");
            ExitCode::from(match e {
                ClientError::Api { .. } => 2,
                _ => 69,
            })
        }
    }
}

/// The requirements a pip requirements file lists (`-`: stdin): a line each, with
/// `#` comments (at the start, or after a space) and blank lines skipped. A pip
/// option is refused with its line: the daemon installs from the policy's index,
/// and says why it refuses anything else (a URL, a path) itself.
fn requirements_file(path: &std::path::Path) -> Result<Vec<String>, ClientError> {
    let text =
        if path.as_os_str() == "-" { std::io::read_to_string(std::io::stdin()) } else { std::fs::read_to_string(path) }
            .map_err(|e| ClientError::Local(format!("reading {}: {e}", path.display())))?;
    parse_requirements(&text).map_err(|(line, what)| {
        ClientError::Local(format!(
            "{} line {line}: {what}: sandboxd takes requirements only (name, [extras], version specifiers); give the packages themselves",
            path.display()
        ))
    })
}

/// [`requirements_file`]'s parse, as pip reads such a file: a leading BOM dropped,
/// lines ending in `\` joined to the next, a comment from a `#` at a line's start or
/// after whitespace. The requirements, or the first bad line (from 1) and what is
/// wrong with it: a pip option, on a line of its own or after a requirement
/// (`--hash=…`). What the daemon refuses of a requirement itself (a URL, a path,
/// an environment marker) it says why.
fn parse_requirements(text: &str) -> Result<Vec<String>, (usize, String)> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    // Logical lines, each with the number of the line it starts on.
    let mut logical: Vec<(usize, String)> = vec![];
    let mut open = false;
    for (i, line) in text.lines().enumerate() {
        let (body, continued) = match line.strip_suffix('\\') {
            Some(head) => (head, true),
            None => (line, false),
        };
        match logical.last_mut() {
            Some((_, joined)) if open => {
                joined.push(' ');
                joined.push_str(body);
            }
            _ => logical.push((i + 1, body.to_string())),
        }
        open = continued;
    }
    let mut out = vec![];
    for (first, line) in logical {
        let cut = line
            .char_indices()
            .find(|&(at, c)| c == '#' && (at == 0 || line[..at].chars().next_back().is_some_and(char::is_whitespace)));
        let requirement = cut.map_or(line.as_str(), |(at, _)| &line[..at]).trim();
        if requirement.is_empty() {
            continue;
        }
        if let Some(option) = requirement.split_whitespace().find(|word| word.starts_with('-')) {
            let option = option.split('=').next().unwrap_or(option);
            return Err((first, format!("pip option {option} is not supported")));
        }
        out.push(requirement.to_string());
    }
    Ok(out)
}

/// What an install did, as pip would say it.
fn print_install(result: &InstallResult) {
    if result.installed.is_empty() {
        println!("Nothing to install: {} already satisfied.", result.unchanged.join(", "));
    } else {
        let names: Vec<String> = result.installed.iter().map(|p| format!("{}-{}", p.name, p.version)).collect();
        println!("Successfully installed {}", names.join(" "));
    }
    eprintln!(
        "sandboxd: the session's package layer holds {} of {}; {} ms",
        size(result.layer_bytes),
        size(result.layer_limit_bytes),
        result.duration_ms
    );
}

/// Bytes as a person reads them: `812 KiB`, `1.3 MiB`, `512 MiB`.
fn size(bytes: u64) -> String {
    const KIB: u64 = 1024;
    const MIB: u64 = 1024 * KIB;
    match bytes {
        b if b < MIB => format!("{} KiB", b.div_ceil(KIB)),
        b if b < 10 * MIB => format!("{:.1} MiB", b as f64 / MIB as f64),
        b => format!("{} MiB", b / MIB),
    }
}

fn print_json(v: &impl serde::Serialize) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

fn read_input(file: Option<&PathBuf>) -> Result<Vec<u8>, ClientError> {
    let mut data = vec![];
    match file {
        None => std::io::stdin().read_to_end(&mut data).map(|_| ()),
        Some(p) if p.as_os_str() == "-" => std::io::stdin().read_to_end(&mut data).map(|_| ()),
        Some(p) => std::fs::read(p).map(|d| data = d),
    }
    .map_err(|e| ClientError::Local(format!("reading the input: {e}")))?;
    Ok(data)
}

async fn dispatch(client: &Client, command: Command) -> Result<ExitCode, ClientError> {
    match command {
        Command::Run { file, session, keep, timeout, policy, shell, json, save, max_bytes, no_figures, packages } => {
            let code = String::from_utf8(read_input(file.as_ref())?)
                .map_err(|_| ClientError::Local("the code is not UTF-8 text".into()))?;
            // Without --session the daemon makes a session for this run alone.
            let made = session.is_none();
            let req = RunRequest {
                code,
                session_id: session,
                language: if shell { Language::Shell } else { Language::Python },
                timeout_s: timeout,
                policy,
                autosave_figures: no_figures.then_some(false),
                packages: (!packages.is_empty()).then_some(packages),
            };
            let result = client.run(&req).await?;
            let saved = match &save {
                Some(dir) => save_artifacts(client, &result, dir, max_bytes).await,
                None => Ok(()),
            };
            if json {
                print_json(&result);
            } else {
                print_result(&result, save.as_deref(), made && !keep);
            }
            if made && !keep {
                if let Err(e) = client.close_session(&result.session_id).await {
                    eprintln!("sandboxctl: could not close the run's session {}: {e}", result.session_id);
                }
            } else if made {
                eprintln!(
                    "sandboxctl: session {id} kept: run in it with --session {id}; close it with `sandboxctl sessions rm {id}`",
                    id = result.session_id
                );
            }
            if let Err(e) = saved {
                eprintln!("sandboxctl: --save: {e}");
                return Ok(ExitCode::from(73));
            }
            Ok(exit_code(&result))
        }
        Command::Sessions { command } => {
            match command {
                SessionsCommand::Ls => {
                    for s in client.list_sessions().await? {
                        println!(
                            "{}\t{}\t{}\t{}\t{}",
                            s.id,
                            if s.mode == Mode::Kernel { "kernel" } else { "script" },
                            s.policy,
                            s.last_used_at,
                            if s.busy { "busy" } else { "idle" }
                        );
                    }
                }
                SessionsCommand::New { id, policy, mode, ttl } => {
                    let mode = match mode.as_deref() {
                        Some("kernel") => Some(Mode::Kernel),
                        Some(_) => Some(Mode::Script),
                        None => None,
                    };
                    let s = client.create_session(&CreateSessionRequest { id, policy, mode, ttl_s: ttl }).await?;
                    println!("{}", s.id);
                }
                SessionsCommand::Show { id } => print_json(&client.get_session(&id).await?),
                SessionsCommand::Runs { id, limit, before } => {
                    for r in client.list_runs(&id, before.as_deref(), limit).await?.runs {
                        let status = serde_json::to_value(r.status).ok();
                        let language = serde_json::to_value(r.language).ok();
                        println!(
                            "{}\t{}\t{}\t{}\t{}",
                            r.run_id,
                            status.as_ref().and_then(|v| v.as_str()).unwrap_or("?"),
                            language.as_ref().and_then(|v| v.as_str()).unwrap_or("?"),
                            r.accepted_at,
                            r.duration_ms.map(|d| d.to_string()).unwrap_or_else(|| "-".into())
                        );
                    }
                }
                SessionsCommand::Run { id, run_id } => print_json(&client.get_run(&id, &run_id).await?),
                SessionsCommand::Rm { id } => {
                    client.close_session(&id).await?;
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Files { command } => {
            match command {
                FilesCommand::Ls { session } => {
                    for f in client.list_files(&session).await? {
                        println!("{}\t{}\t{}", f.size_bytes, f.mime_type, printable(&f.path));
                    }
                }
                FilesCommand::Get { session, path, output, max_bytes } => {
                    let mut budget = Budget::new(max_bytes);
                    let mut download = client.download(&session, &path).await?;
                    let written = match output {
                        // A device or pipe named by the operator is written as it is.
                        Some(p) if std::fs::metadata(&p).is_ok_and(|m| !m.is_file() && !m.is_dir()) => {
                            match std::fs::OpenOptions::new().write(true).open(&p) {
                                Ok(mut f) => download::stream(&mut download, &mut f, &mut budget, &path).await,
                                Err(e) => Err(download::Error::Io(p.display().to_string(), e)),
                            }
                        }
                        Some(p) => match download::create_at(&p) {
                            Ok(into) => download::save(&mut download, into, &mut budget, &path).await,
                            Err(e) => Err(e),
                        },
                        None => {
                            download::stream(&mut download, &mut std::io::stdout().lock(), &mut budget, &path).await
                        }
                    };
                    match written {
                        Ok(_) => {}
                        Err(download::Error::Client(e)) => return Err(e),
                        Err(e) => {
                            eprintln!("sandboxctl: {e}");
                            return Ok(ExitCode::from(73));
                        }
                    }
                }
                FilesCommand::Put { session, local, path, overwrite } => {
                    let data = read_input(Some(&local))?;
                    println!("{}", printable(&client.upload(&session, &path, overwrite, data).await?.path));
                }
                FilesCommand::Rm { session, path } => {
                    client.delete_file(&session, &path).await?;
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Pip { command: PipCommand::Install { session, mut packages, requirements, json } } => {
            for file in &requirements {
                packages.extend(requirements_file(file)?);
            }
            if packages.is_empty() {
                return Err(ClientError::Local(
                    "the requirements files list no requirement: nothing to install".into(),
                ));
            }
            let result = client.install_packages(&session, &InstallRequest { packages }).await?;
            if json {
                print_json(&result);
            } else {
                print_install(&result);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Secrets { command } => {
            match command {
                SecretsCommand::Set { session, name, hosts, places } => {
                    let mut line = String::new();
                    std::io::stdin()
                        .read_line(&mut line)
                        .map_err(|e| ClientError::Local(format!("reading the value from stdin: {e}")))?;
                    let value = line.trim_end_matches(['\n', '\r']).to_string();
                    let substitute_in = if places.is_empty() {
                        SecretPlace::default_places()
                    } else {
                        places
                            .iter()
                            .filter_map(|p| serde_json::from_value(serde_json::Value::String(p.clone())).ok())
                            .collect()
                    };
                    let info =
                        client.set_secret(&session, &name, &SecretRequest { value, hosts, substitute_in }).await?;
                    let places: Vec<&str> = info.substitute_in.iter().map(|p| p.as_str()).collect();
                    println!("{} -> {} (in {})", info.name, info.hosts.join(", "), places.join(", "));
                }
                SecretsCommand::Ls { session } => {
                    for s in client.list_secrets(&session).await? {
                        let source = serde_json::to_value(s.source).ok().and_then(|v| v.as_str().map(String::from));
                        println!("{}\t{}\t{}", s.name, source.unwrap_or_default(), s.hosts.join(","));
                    }
                }
                SecretsCommand::Rm { session, name } => {
                    client.delete_secret(&session, &name).await?;
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Health => {
            print_json(&client.health().await?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Doctor => {
            let report = client.check().await?;
            print!("{}", report.render());
            Ok(if report.ok { ExitCode::SUCCESS } else { ExitCode::from(1) })
        }
        Command::Completions { .. } | Command::Mcp => Ok(ExitCode::SUCCESS),
    }
}

/// The stdio MCP server, until the client closes stdin: a bridge to the daemon's
/// `/mcp` ([`sandboxd::bridge`]).
async fn serve_mcp(client: Client) -> Result<(), String> {
    sandboxd::bridge::run(client).await
}

/// The program's exit code; 124 for a timeout (as `timeout(1)`), 128+N for signal N.
fn exit_code(result: &RunResult) -> ExitCode {
    if result.status == Status::Timeout {
        return ExitCode::from(124);
    }
    if let Some(code) = result.exit_code {
        return ExitCode::from((code & 0xff) as u8);
    }
    let sig = result
        .signal
        .as_deref()
        .and_then(|s| s.parse::<nix::sys::signal::Signal>().ok())
        .map(|s| s as i32)
        .unwrap_or(9);
    ExitCode::from((128 + sig).min(255) as u8)
}

/// The run's output, as the program would have printed it, and what became of it.
/// `gone`: the run's session is closed after this (made for it, not kept).
fn print_result(result: &RunResult, saved_in: Option<&std::path::Path>, gone: bool) {
    let _ = std::io::stdout().write_all(result.stdout.as_bytes());
    let _ = std::io::stderr().write_all(result.stderr.as_bytes());
    for (truncated, name) in [(result.stdout_truncated, "stdout"), (result.stderr_truncated, "stderr")] {
        if truncated {
            eprintln!("sandboxctl: {name} was truncated at the policy's output limit");
        }
    }
    match result.status {
        Status::Timeout => eprintln!("sandboxctl: the run hit its time limit"),
        Status::Oom => eprintln!("sandboxctl: the run ran out of memory"),
        Status::Killed => {
            eprintln!("sandboxctl: the run was killed by {}", result.signal.as_deref().unwrap_or("a signal"))
        }
        Status::Ok | Status::Error => {}
    }
    if !result.artifacts.is_empty() {
        match (saved_in, gone) {
            (Some(dir), _) => eprintln!("sandboxctl: artifacts, saved in {}:", dir.display()),
            (None, true) => eprintln!(
                "sandboxctl: artifacts (closed with the run's session: pass --save DIR to download them, or --keep to keep the session):"
            ),
            (None, false) => eprintln!("sandboxctl: session {} artifacts:", result.session_id),
        }
        for a in &result.artifacts {
            eprintln!("  {} ({} bytes)", printable(&a.path), a.size_bytes);
        }
    }
}

/// Download the run's artifacts into `dir`, at most `max_bytes` in all: a run
/// whose files are larger saves none; a file that grew past it is not kept. A
/// file whose name cannot be saved below `dir` (not a plain relative path, or
/// through a symlink there) is skipped, said so, and counted in the error.
async fn save_artifacts(
    client: &Client,
    result: &RunResult,
    dir: &std::path::Path,
    max_bytes: u64,
) -> Result<(), download::Error> {
    let mut budget = Budget::new(max_bytes);
    let total = result.artifacts.iter().map(|a| a.size_bytes).fold(0u64, u64::saturating_add);
    if !budget.fits(total) {
        return Err(download::Error::RunOverBudget { count: result.artifacts.len(), total, limit: max_bytes });
    }
    let root = SaveDir::open(dir)?;
    let mut skipped = 0;
    for a in &result.artifacts {
        let into = match root.create(&a.path) {
            Ok(into) => into,
            Err(e @ download::Error::Name { .. }) => {
                eprintln!("sandboxctl: --save: {e}: not saved");
                skipped += 1;
                continue;
            }
            Err(e) => return Err(e),
        };
        let mut download = client.download(&result.session_id, &a.path).await?;
        download::save(&mut download, into, &mut budget, &printable(&a.path)).await?;
    }
    match skipped {
        0 => Ok(()),
        n => Err(download::Error::NotSaved { count: n, of: result.artifacts.len() }),
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_requirements, size};

    #[test]
    fn a_requirements_file_gives_its_requirements_and_refuses_pip_options() {
        let text = "# data tools\ntabulate==0.9.0  # pinned\n\n  requests>=2\t# http\npandas[excel]\n";
        assert_eq!(parse_requirements(text).unwrap(), ["tabulate==0.9.0", "requests>=2", "pandas[excel]"]);
        assert_eq!(parse_requirements("six\n-e .\n").unwrap_err(), (2, "pip option -e is not supported".into()));
        assert_eq!(
            parse_requirements("--index-url https://x\nsix").unwrap_err(),
            (1, "pip option --index-url is not supported".into())
        );
        assert_eq!(parse_requirements("\n# nothing\n").unwrap(), Vec::<String>::new());
        // A comment starts at the first `#` after whitespace, whichever whitespace.
        assert_eq!(parse_requirements("a>=1\t# x #y\nb # c\t#d\n").unwrap(), ["a>=1", "b"]);
        // Not inside a word: a URL's fragment is the daemon's to refuse, with the rest.
        assert_eq!(parse_requirements("p @ https://x/p.whl#sha256=00").unwrap(), ["p @ https://x/p.whl#sha256=00"]);
        // A BOM, and lines joined by a trailing backslash.
        assert_eq!(parse_requirements("\u{feff}six==1.16.0\n").unwrap(), ["six==1.16.0"]);
        assert_eq!(parse_requirements("six\\\n  ==1.16.0\n").unwrap(), ["six   ==1.16.0"]);
        assert_eq!(parse_requirements("a\nsix\\").unwrap(), ["a", "six"]);
        // An option after a requirement (pip-compile's hashes), at the line it starts on.
        assert_eq!(
            parse_requirements("x\na==1 \\\n    --hash=sha256:00\n").unwrap_err(),
            (2, "pip option --hash is not supported".into())
        );
    }

    #[test]
    fn sizes_read_as_a_person_reads_them() {
        assert_eq!(size(0), "0 KiB");
        assert_eq!(size(1), "1 KiB");
        assert_eq!(size(263_168), "257 KiB");
        assert_eq!(size(1_363_148), "1.3 MiB");
        assert_eq!(size(64 << 20), "64 MiB");
        assert_eq!(size(512 << 20), "512 MiB");
    }
}
