use ficco_core::lower::lower;
use ficco_core::schedule::{enumerate, SpaceOptions};
use ficco_core::workload::{Op, Problem};
fn main() {
    for op in Op::ALL {
        for p in [2usize, 4, 8] {
            let prob = Problem::new(op, 8192, 8192, 8192, p).unwrap();
            let scheds = enumerate(op, SpaceOptions::default());
            let mut classes: Vec<(Vec<_>, Vec<String>)> = vec![];
            let mut n = 0;
            for s in scheds {
                let Ok(plan) = lower(&prob, &s) else { continue };
                n += 1;
                let key = (plan.ranks.clone(), plan.resources.clone());
                let mut labels = plan.ranks.clone();
                let _ = &mut labels;
                match classes.iter_mut().find(|c| c.0 == vec![key.clone()]) {
                    Some(c) => c.1.push(s.to_string()),
                    None => classes.push((vec![key], vec![s.to_string()])),
                }
            }
            println!("{:?} P={p}: {n} schedules, {} distinct plans", op, classes.len());
            for c in classes.iter().filter(|c| c.1.len() > 1) {
                println!("   {:?}", c.1);
            }
        }
    }
}
