//! Settings from outside the command line, as etcd takes them: a YAML file (`--config-file`,
//! with etcd's keys, which are its flags' names) and `ETCD_*` environment variables (the flag's
//! name in capitals, `-` as `_`), plus `CAIRN_*` for the same names.
//!
//! They become flags put before the command line's own, each only if nothing of higher rank sets
//! it: a flag over `CAIRN_*` over `ETCD_*` over the file. (etcd ignores flags and environment
//! altogether when given a file; cairn lets them override it, which is what an operator who
//! adds a flag expects.) A list flag is replaced whole, never merged across sources.

use std::ffi::OsString;

use yaml_rust2::{Yaml, YamlLoader};

/// Keys etcd's configuration file takes beyond its flags' names (TLS blocks, socket options).
const ETCD_ONLY_KEYS: &[&str] =
    &["client-transport-security", "peer-transport-security", "socket-options"];

/// What the settings outside the command line came to.
#[derive(Debug, Default)]
pub(crate) struct Expanded {
    /// The command line with the file's and the environment's flags put in.
    pub args: Vec<OsString>,
    /// Environment variables that looked like settings and were ignored, for the log.
    pub ignored: Vec<String>,
}

/// Expands `args` (the program's arguments, program name first). `known` holds the flags the
/// server takes (long names); `etcd` every flag etcd has. Commands other than serving are left
/// alone.
pub(crate) fn expand(
    args: Vec<OsString>,
    env: impl IntoIterator<Item = (String, String)>,
    known: &[String],
    etcd: &[&str],
) -> Result<Expanded, String> {
    let first = args.get(1).and_then(|a| a.to_str()).unwrap_or("");
    let at = match first {
        "serve" => 2,
        "" => 1,
        f if f.starts_with('-') && !matches!(f, "-h" | "--help" | "-V" | "--version") => 1,
        _ => return Ok(Expanded { args, ignored: Vec::new() }),
    };
    // Names already set, by the command line first, then by each source in rank.
    let mut set: Vec<String> = args[at..].iter().filter_map(flag_name).collect();
    let env: Vec<(String, String)> = env.into_iter().collect();
    let mut from_env = Vec::new();
    let mut ignored = Vec::new();
    let mut file = flag_value(&args[at..], "config-file");
    for prefix in ["CAIRN_", "ETCD_"] {
        for (var, value) in &env {
            let Some(rest) = var.strip_prefix(prefix) else { continue };
            let name = rest.to_ascii_lowercase().replace('_', "-");
            if name == "config-file" {
                file = file.or_else(|| Some(value.clone()));
            } else if known.contains(&name) {
                if !set.contains(&name) {
                    from_env.push(OsString::from(format!("--{name}={value}")));
                    set.push(name);
                }
            } else if etcd.contains(&name.as_str()) {
                return Err(format!("{var}: --{name} is an etcd flag cairn does not support yet"));
            } else {
                ignored.push(var.clone());
            }
        }
    }
    let from_file = match file {
        Some(path) => read(&path, known, etcd)?,
        None => Vec::new(),
    };
    let mut out: Vec<OsString> = args[..at].to_vec();
    out.extend(from_file.into_iter().filter(|(name, _)| !set.contains(name)).map(|(_, f)| f));
    out.extend(from_env);
    out.extend(args[at..].iter().cloned());
    Ok(Expanded { args: out, ignored })
}

/// The long flag `a` sets, if it is one (`--name` or `--name=value`).
fn flag_name(a: &OsString) -> Option<String> {
    let name = a.to_str()?.strip_prefix("--")?;
    Some(name.split_once('=').map_or(name, |(n, _)| n).to_string())
}

/// The value of `--name V` or `--name=V` on the command line, the last one if repeated.
fn flag_value(args: &[OsString], name: &str) -> Option<String> {
    let long = format!("--{name}");
    let mut found = None;
    let mut it = args.iter().filter_map(|a| a.to_str());
    while let Some(a) = it.next() {
        if a == long {
            found = it.next().map(str::to_string);
        } else if let Some(v) = a.strip_prefix(&long).and_then(|r| r.strip_prefix('=')) {
            found = Some(v.to_string());
        }
    }
    found
}

/// The flags a configuration file sets, by name.
fn read(path: &str, known: &[String], etcd: &[&str]) -> Result<Vec<(String, OsString)>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("--config-file {path}: {e}"))?;
    parse(&text, known, etcd).map_err(|e| format!("--config-file {path}: {e}"))
}

/// Turns etcd's YAML configuration into flags: every key must be a flag cairn shares with etcd.
fn parse(text: &str, known: &[String], etcd: &[&str]) -> Result<Vec<(String, OsString)>, String> {
    let docs = YamlLoader::load_from_str(text).map_err(|e| e.to_string())?;
    let Some(doc) = docs.into_iter().next() else { return Ok(Vec::new()) };
    let map = match doc {
        Yaml::Hash(map) => map,
        Yaml::Null => return Ok(Vec::new()),
        _ => return Err("expected a mapping of settings".into()),
    };
    let mut flags = Vec::new();
    for (key, value) in map {
        let Some(key) = key.as_str() else {
            return Err(format!("a key that is not a name: {key:?}"));
        };
        let supported = known.iter().any(|k| k == key) && key != "config-file";
        if !supported {
            return Err(if etcd.contains(&key) || ETCD_ONLY_KEYS.contains(&key) {
                format!("{key} is an etcd setting cairn does not support yet")
            } else {
                format!("unknown key {key}")
            });
        }
        let Some(value) = scalar(&value).or_else(|| list(&value)) else {
            return Err(format!("{key}: expected a value or a list of values"));
        };
        flags.push((key.to_string(), OsString::from(format!("--{key}={value}"))));
    }
    Ok(flags)
}

fn scalar(v: &Yaml) -> Option<String> {
    match v {
        Yaml::String(s) | Yaml::Real(s) => Some(s.clone()),
        Yaml::Integer(i) => Some(i.to_string()),
        Yaml::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}

/// A list, as etcd's `log-outputs`, is the comma-separated value its flag takes.
fn list(v: &Yaml) -> Option<String> {
    let Yaml::Array(items) = v else { return None };
    let items: Option<Vec<String>> = items.iter().map(scalar).collect();
    Some(items?.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known() -> Vec<String> {
        ["name", "data-dir", "listen-client-urls", "log-outputs", "config-file", "snapshot-count"]
            .map(String::from)
            .to_vec()
    }

    const ETCD: &[&str] = &["name", "data-dir", "auto-tls", "config-file"];

    fn strs(v: &[OsString]) -> Vec<&str> {
        v.iter().map(|a| a.to_str().expect("utf-8")).collect()
    }

    #[test]
    fn file_keys_become_flags_and_lists_join() {
        let yaml = "name: 'm1'\nsnapshot-count: 5000\nlog-outputs: [stderr]\n";
        let flags: Vec<OsString> =
            parse(yaml, &known(), ETCD).expect("valid").into_iter().map(|(_, f)| f).collect();
        assert_eq!(strs(&flags), ["--name=m1", "--snapshot-count=5000", "--log-outputs=stderr"]);
    }

    #[test]
    fn unknown_and_unsupported_keys_are_named() {
        let e = parse("name: a\nnot-a-key: 1\n", &known(), ETCD).expect_err("unknown");
        assert_eq!(e, "unknown key not-a-key");
        let e = parse("auto-tls: true\n", &known(), ETCD).expect_err("unsupported");
        assert_eq!(e, "auto-tls is an etcd setting cairn does not support yet");
        let e = parse("peer-transport-security:\n  cert-file: x\n", &known(), ETCD)
            .expect_err("unsupported");
        assert!(e.starts_with("peer-transport-security is an etcd setting"), "{e}");
    }

    #[test]
    fn flags_come_after_the_environment_after_the_file() {
        let dir = std::env::temp_dir().join(format!("cairn-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("c.yml");
        let yaml = "name: f\ndata-dir: /file\nlisten-client-urls: http://f:1\nsnapshot-count: 7\n";
        std::fs::write(&file, yaml).expect("write");
        let args: Vec<OsString> =
            ["cairn", "serve", "--config-file", file.to_str().expect("utf-8"), "--name", "flag"]
                .map(OsString::from)
                .to_vec();
        let env = [
            ("ETCD_DATA_DIR".to_string(), "/etcd-env".to_string()),
            ("CAIRN_DATA_DIR".to_string(), "/cairn-env".to_string()),
            ("ETCD_LISTEN_CLIENT_URLS".to_string(), "http://e:2".to_string()),
            ("ETCD_UNSUPPORTED_ARCH".to_string(), "arm".to_string()),
        ];
        let out = expand(args, env, &known(), ETCD).expect("expands");
        let got = strs(&out.args);
        // Each setting once, from the source of highest rank; the flags as given, last.
        let mut want = vec!["cairn", "serve", "--snapshot-count=7", "--data-dir=/cairn-env"];
        want.push("--listen-client-urls=http://e:2");
        want.extend(["--config-file", file.to_str().expect("utf-8"), "--name", "flag"]);
        assert_eq!(got, want);
        assert_eq!(out.ignored, ["ETCD_UNSUPPORTED_ARCH"]);
        let env = [("ETCD_AUTO_TLS".to_string(), "true".to_string())];
        let e = expand(vec!["cairn".into()], env, &known(), ETCD).expect_err("unsupported");
        assert_eq!(e, "ETCD_AUTO_TLS: --auto-tls is an etcd flag cairn does not support yet");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn other_commands_are_left_alone() {
        let args: Vec<OsString> = ["cairn", "bench", "--name", "x"].map(OsString::from).to_vec();
        let env = [("ETCD_NAME".to_string(), "e".to_string())];
        let out = expand(args.clone(), env, &known(), ETCD).expect("untouched");
        assert_eq!(out.args, args);
    }
}
