//! The data a safe pickle can hold, and nothing that could run code.
//!
//! Containers are reference counted because pickles share objects through the memo (PyTorch
//! shares every deduplicated stack between thousands of trace entries): sharing an `Rc` keeps
//! reading linear in the file instead of copying each shared list at every use. Dicts are a
//! `Vec` of pairs in insertion order, not a hash map: snapshot dicts have a handful of keys, a
//! linear scan over them is faster than hashing, and the order is Python's.

use std::fmt;
use std::rc::Rc;

/// A Python value built from a pickle (or to be written as one).
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Value {
    #[default]
    None,
    Bool(bool),
    /// Python ints that fit in 64 bits; wider ones are refused by the reader.
    Int(i64),
    Float(f64),
    /// `Rc<String>` rather than `Rc<str>`: a thin pointer keeps every `Value` at 16 bytes,
    /// which matters more for speed than the second allocation of a rare new string.
    Str(Rc<String>),
    Bytes(Rc<Vec<u8>>),
    List(Rc<Vec<Value>>),
    Tuple(Rc<Vec<Value>>),
    /// Key/value pairs in insertion order. Duplicate keys are kept as written; [`Value::get`]
    /// returns the last, as Python's dict would hold it.
    Dict(Rc<Vec<(Value, Value)>>),
}

impl Value {
    pub fn bytes(b: &[u8]) -> Value {
        Value::Bytes(Rc::new(b.to_vec()))
    }

    pub fn str(s: &str) -> Value {
        Value::Str(Rc::new(s.to_string()))
    }

    pub fn list(items: Vec<Value>) -> Value {
        Value::List(Rc::new(items))
    }

    pub fn tuple(items: Vec<Value>) -> Value {
        Value::Tuple(Rc::new(items))
    }

    pub fn dict(pairs: Vec<(Value, Value)>) -> Value {
        Value::Dict(Rc::new(pairs))
    }

    /// A dict with string keys, the shape of every dict in a snapshot.
    pub fn str_dict<'a>(pairs: impl IntoIterator<Item = (&'a str, Value)>) -> Value {
        Value::dict(pairs.into_iter().map(|(k, v)| (Value::str(k), v)).collect())
    }

    /// The Python type name, for error messages ("expected an int, got str").
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Bytes(_) => "bytes",
            Value::List(_) => "list",
            Value::Tuple(_) => "tuple",
            Value::Dict(_) => "dict",
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The int, if this is one. Bools are not ints here, although Python would accept them:
    /// a bool where a size belongs is a broken file, not a size.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            _ => None,
        }
    }

    pub fn as_float(&self) -> Option<f64> {
        match self {
            Value::Float(f) => Some(*f),
            Value::Int(i) => Some(*i as f64),
            _ => None,
        }
    }

    /// The items of a list or a tuple.
    pub fn as_seq(&self) -> Option<&[Value]> {
        match self {
            Value::List(items) | Value::Tuple(items) => Some(items),
            _ => None,
        }
    }

    pub fn as_dict(&self) -> Option<&[(Value, Value)]> {
        match self {
            Value::Dict(pairs) => Some(pairs),
            _ => None,
        }
    }

    /// Look up a string key in a dict; `None` for a missing key or a non-dict.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.as_dict()?.iter().rev().find(|(k, _)| k.as_str() == Some(key)).map(|(_, v)| v)
    }
}

impl fmt::Display for Value {
    /// A short Python-like rendering for messages; long containers are elided.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::None => f.write_str("None"),
            Value::Bool(b) => f.write_str(if *b { "True" } else { "False" }),
            Value::Int(i) => write!(f, "{i}"),
            Value::Float(x) => write!(f, "{x:?}"),
            Value::Str(s) => f.write_str(&allocsim_core::text::quoted(s)),
            Value::Bytes(b) => write!(f, "<{} bytes>", b.len()),
            Value::List(items) => write!(f, "[<{} items>]", items.len()),
            Value::Tuple(items) => write!(f, "(<{} items>)", items.len()),
            Value::Dict(pairs) => write!(f, "{{<{} keys>}}", pairs.len()),
        }
    }
}

// Every value is a tag and one word: containers of values stay compact and cheap to move.
const _: () = assert!(size_of::<Value>() == 16);
