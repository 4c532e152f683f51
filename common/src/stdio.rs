//! Printing that survives a closed stdout or stderr, for the three binaries.
//!
//! `println!` and `eprintln!` panic when the stream is gone (`govc status | head -1`,
//! `govd 2>&1 | head -3`): the process then exits 101 with a panic message nobody
//! reads, or, in a daemon, a task dies half-way through what it was doing (govd's
//! signal task did, so SIGTERM was ignored). A closed stream is not an error of the
//! command: these macros write what they can and drop the rest.

/// `print!` to stdout, ignoring a closed stdout.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        let _ = ::std::write!(::std::io::stdout(), $($arg)*);
    }};
}

/// `println!` to stdout, ignoring a closed stdout.
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        let _ = ::std::writeln!(::std::io::stdout(), $($arg)*);
    }};
}

/// `eprint!` to stderr, ignoring a closed stderr.
#[macro_export]
macro_rules! err {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        let _ = ::std::write!(::std::io::stderr(), $($arg)*);
    }};
}

/// `eprintln!` to stderr, ignoring a closed stderr.
#[macro_export]
macro_rules! errln {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        let _ = ::std::writeln!(::std::io::stderr(), $($arg)*);
    }};
}
