//! How an error reads to a user, the same from the command line and from
//! the Python package.

/// The error and its causes on one line, skipping what is said twice: a cause
/// the message already quotes (error types often embed their source), or a
/// context the cause repeats as its own prefix (a file name).
pub fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() && text.starts_with(&line) {
            line = text;
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line.replace('\n', " ")
}
