//! Shell completions and the man page, generated from the clap definition in `cli` so they
//! never drift from the real flags. Outside the analysis pipeline: `stallscope completions
//! bash|zsh|fish` and `stallscope man` call these and exit.

use clap::Command;
use std::io::{self, Write};
use std::path::Path;

/// The shells `stallscope completions` supports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CompletionShell {
    Bash,
    Zsh,
    Fish,
}

/// Writes the completion script for `shell` (install it as the shell expects, e.g.
/// `stallscope completions bash > /etc/bash_completion.d/stallscope`).
pub fn completions(mut cmd: Command, shell: CompletionShell, w: &mut dyn Write) -> io::Result<()> {
    let name = cmd.get_name().to_string();
    let mut buf = Vec::new();
    match shell {
        CompletionShell::Bash => {
            clap_complete::generate(clap_complete::Shell::Bash, &mut cmd, name, &mut buf)
        }
        CompletionShell::Zsh => {
            clap_complete::generate(clap_complete::Shell::Zsh, &mut cmd, name, &mut buf)
        }
        CompletionShell::Fish => {
            clap_complete::generate(clap_complete::Shell::Fish, &mut cmd, name, &mut buf)
        }
    }
    w.write_all(&buf)
}

/// Writes the man page (roff) of the top command: synopsis, options, subcommand list.
/// Each subcommand's page is written with [`man_pages`].
pub fn man(cmd: Command, w: &mut dyn Write) -> io::Result<()> {
    clap_mangen::Man::new(cmd).render(w)
}

/// Writes `NAME.1` and one `NAME-SUB.1` per subcommand into `dir`; returns the file names.
pub fn man_pages(cmd: Command, dir: &Path) -> io::Result<Vec<String>> {
    let mut cmd = cmd;
    cmd.build();
    let name = cmd.get_name().to_string();
    let mut written = Vec::new();
    let mut page = |c: Command, file: String| -> io::Result<()> {
        let mut f = std::fs::File::create(dir.join(&file))?;
        clap_mangen::Man::new(c).render(&mut f)?;
        written.push(file);
        Ok(())
    };
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        let full = format!("{name}-{}", sub.get_name());
        page(
            sub.clone().name(full.clone()).display_name(full.clone()),
            format!("{full}.1"),
        )?;
    }
    page(cmd, format!("{name}.1"))?;
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, ArgAction};

    fn cli() -> Command {
        Command::new("stallscope")
            .about("Explains latency stalls of a redis-server from its system calls")
            .subcommand(
                Command::new("analyze")
                    .about("Analyze a saved trace")
                    .arg(Arg::new("files").num_args(0..))
                    .arg(
                        Arg::new("threshold")
                            .long("threshold")
                            .help("Stall threshold"),
                    )
                    .arg(Arg::new("html").long("html").help("Write an HTML report")),
            )
            .subcommand(
                Command::new("attach")
                    .arg(Arg::new("pid").long("pid"))
                    .arg(Arg::new("strict").long("strict").action(ArgAction::SetTrue)),
            )
    }

    #[test]
    fn completions_name_subcommands_and_flags() {
        for shell in [
            CompletionShell::Bash,
            CompletionShell::Zsh,
            CompletionShell::Fish,
        ] {
            let mut out = Vec::new();
            completions(cli(), shell, &mut out).unwrap_or_else(|e| panic!("{shell:?}: {e}"));
            let s = String::from_utf8_lossy(&out);
            assert!(s.contains("stallscope"), "{shell:?}");
            assert!(s.contains("analyze") && s.contains("attach"), "{shell:?}");
            assert!(s.contains("threshold") && s.contains("html"), "{shell:?}");
        }
    }

    #[test]
    fn man_page_is_roff_with_options() {
        let mut out = Vec::new();
        man(cli(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        let s = String::from_utf8_lossy(&out);
        assert!(s.contains(".TH stallscope"), "{s}");
        assert!(s.contains("analyze"));
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let files = man_pages(cli(), dir.path()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            files,
            [
                "stallscope-analyze.1",
                "stallscope-attach.1",
                "stallscope.1"
            ]
        );
        let sub =
            std::fs::read_to_string(dir.path().join("stallscope-analyze.1")).unwrap_or_default();
        assert!(sub.contains("\\-\\-threshold"), "{sub}");
    }
}
