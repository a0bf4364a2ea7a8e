//! App layer: the commands, the only layer that sees the command line (`cli`). Each command
//! turns its flags into the plain configurations of the layers below and runs them.

pub mod attach;
