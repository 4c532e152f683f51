//! Tests of the `Examples:` sections of `--help`: every command shows 2 to 4
//! invocations, and each one parses with the binary's own clap definition,
//! so an example cannot drift from the flags. The tests of `govc`, `govd`
//! and `gov-agent` use it (`gov_common::testing`).

/// Checks the examples of `cmd` and of every subcommand below it (leaving out
/// clap's `help`): each help has an `Examples:` section with 2 to 4 lines
/// that run the binary, on the command they document, and `parse` accepts
/// each one (the words after the binary's name). Returns how many it checked.
pub fn check(
    mut cmd: clap::Command,
    parse: impl Fn(Vec<String>) -> Result<(), clap::Error>,
) -> usize {
    cmd.build();
    let bin = cmd.get_name().to_owned();
    let mut checked = 0;
    let mut stack = vec![(Vec::<String>::new(), cmd)];
    while let Some((path, mut cmd)) = stack.pop() {
        for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
            let mut below = path.clone();
            below.push(sub.get_name().to_owned());
            stack.push((below, sub.clone()));
        }
        let help = cmd.render_long_help().to_string();
        let place = format!(
            "`{}`",
            [bin.as_str()]
                .into_iter()
                .chain(path.iter().map(String::as_str))
                .collect::<Vec<_>>()
                .join(" ")
        );
        let examples = examples(&help, &bin)
            .unwrap_or_else(|| panic!("{place} --help has no `Examples:` section:\n{help}"));
        assert!(
            (2..=4).contains(&examples.len()),
            "{place} --help shows {} examples, not 2 to 4:\n{help}",
            examples.len()
        );
        for example in examples {
            let words = words(&example);
            assert!(
                words.starts_with(&path),
                "{place} --help shows `{example}`, an example of another command"
            );
            if let Err(e) = parse(words) {
                panic!("{place} --help shows `{example}`, which does not parse:\n{e}");
            }
            checked += 1;
        }
    }
    checked
}

/// The example lines after `Examples:` that run `bin` (comments and prose
/// left out), without the binary's name and without a redirection.
fn examples(help: &str, bin: &str) -> Option<Vec<String>> {
    let (_, section) = help.split_once("\nExamples:\n")?;
    let prefix = format!("{bin} ");
    Some(
        section
            .lines()
            .filter_map(|l| l.trim().strip_prefix(&prefix))
            .map(|l| l.split(" > ").next().unwrap_or(l).to_owned())
            .collect(),
    )
}

/// Splits a command line as a POSIX shell would, for the quoting examples
/// use: words separated by spaces, `'...'` and `"..."` kept together.
fn words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = None::<String>;
    let mut quote = None;
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.get_or_insert_default().push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                word.get_or_insert_default();
            }
            (None, ' ') => words.extend(word.take()),
            (None, c) => word.get_or_insert_default().push(c),
        }
    }
    words.extend(word);
    words
}
