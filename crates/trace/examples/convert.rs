//! Convert a trace between formats: `cargo run -p allocsim-trace --example convert -- IN OUT`.

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(input), Some(output)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: convert IN OUT");
        std::process::exit(2);
    };
    let result = allocsim_trace::read_trace(input)
        .and_then(|t| allocsim_trace::write_trace(&t, output).map(|()| t));
    match result {
        Ok(t) => println!(
            "{} ops, {} recorded events, {} stacks",
            t.ops.len(),
            t.recorded.len(),
            t.stacks.len()
        ),
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
}
