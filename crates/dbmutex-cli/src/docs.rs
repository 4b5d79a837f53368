//! `dbmutex help`, `completions` and `man`: documentation generated from the
//! clap definition in [`crate::cli`], so it cannot drift from the flags.

use std::io::Write;

use clap::CommandFactory;
use clap_complete::Shell;

use crate::cli::Cli;
use crate::exit::{self, Failure};

/// `dbmutex help [COMMAND...]`: clap's help for that (sub)command, as
/// `dbmutex COMMAND... --help` prints it. Returns clap's outcome, which
/// `main` prints (the help, or a usage error for an unknown subcommand).
pub fn help(words: &[String]) -> Result<clap::Error, Failure> {
    let argv = std::iter::once("dbmutex")
        .chain(words.iter().map(String::as_str))
        .chain(std::iter::once("--help"));
    match Cli::command().try_get_matches_from(argv) {
        Err(e) => Ok(e),
        // `--help` always ends the parse; this is unreachable in practice.
        Ok(_) => Err(Failure::usage(format!("no help for {}", words.join(" ")))),
    }
}

/// `dbmutex completions SHELL`: the completion script on stdout.
pub fn completions(shell: Shell) -> Result<(), Failure> {
    let mut buf = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "dbmutex", &mut buf);
    write_out(&buf)
}

/// `dbmutex man [COMMAND]`: dbmutex(1), or dbmutex-COMMAND(1), in roff.
pub fn man(command: Option<&str>) -> Result<(), Failure> {
    let mut cmd = Cli::command();
    // Sets the subcommands' display names (dbmutex-run), as clap_mangen's
    // own generate_to does.
    cmd.build();
    let page = match command {
        None => cmd,
        Some(name) => cmd
            .get_subcommands()
            .find(|s| s.get_name() == name && !s.is_hide_set())
            .cloned()
            .ok_or_else(|| {
                let names: Vec<&str> = cmd.get_subcommands().map(|s| s.get_name()).collect();
                Failure::usage(format!("no subcommand {name:?}: use one of {}", names.join(", ")))
            })?,
    };
    write_out(render_man(page).as_bytes())
}

/// The page as clap_mangen renders it, except the text after the options
/// (`after_help`: exit statuses, examples), which is laid out in columns:
/// clap_mangen gives it to roff to fill, which would break those columns,
/// so it goes in a no-fill section (DETAILS) of its own.
fn render_man(page: clap::Command) -> String {
    let details = page.get_after_help().map(|s| s.to_string());
    let page = page.after_help(None::<&'static str>);
    let mut buf = Vec::new();
    clap_mangen::Man::new(page)
        .render(&mut buf)
        .expect("rendering into memory cannot fail");
    let mut text = String::from_utf8(buf).expect("clap_mangen writes UTF-8");
    if let Some(details) = details {
        let mut section = String::from(".SH DETAILS\n.nf\n");
        for line in details.lines() {
            section.push_str(&roff_line(line));
            section.push('\n');
        }
        section.push_str(".fi\n");
        let at = text.find(".SH VERSION").unwrap_or(text.len());
        text.insert_str(at, &section);
    }
    text
}

/// One line of text for roff, printed as written: backslashes and hyphens
/// escaped, a leading `.` or `'` kept from being read as a request.
fn roff_line(line: &str) -> String {
    let escaped = line.replace('\\', "\\e").replace('-', "\\-");
    if escaped.starts_with(['.', '\'']) {
        format!("\\&{escaped}")
    } else {
        escaped
    }
}

fn write_out(buf: &[u8]) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    out.write_all(buf)
        .and_then(|()| out.flush())
        .map_err(|e| Failure::new(exit::IO_ERROR, format!("cannot write to stdout: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roff_lines_print_as_written() {
        assert_eq!(roff_line("a-b"), "a\\-b");
        assert_eq!(roff_line(".TH x"), "\\&.TH x");
        assert_eq!(roff_line("'x"), "\\&'x");
        assert_eq!(roff_line("c:\\d"), "c:\\ed");
    }

    /// Every page renders; the columns of the exit-status table survive.
    #[test]
    fn pages_keep_their_columns() {
        let page = render_man(Cli::command());
        assert!(page.contains(".SH DETAILS\n.nf\n"), "{page}");
        assert!(page.contains("\n  75 (or \\-E N)   not acquired"), "{page}");
        let details = page.find(".SH DETAILS").unwrap();
        assert!(page.find(".SH VERSION").is_none_or(|v| v > details));
    }
}
