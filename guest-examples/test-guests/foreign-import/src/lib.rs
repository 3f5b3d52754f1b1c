//! Test guest: a `vvm:host` service that also imports an interface vvm-host does not provide
//! (`acme:db/query`), as a component built against another host's WIT is.

wit_bindgen::generate!({
    inline: "
        package acme:db@1.0.0;
        interface query {
            run: func(sql: string) -> string;
        }
        world foreign {
            include vvm:host/service@0.1.0;
            import query;
        }
    ",
    path: "../../../wit",
    world: "acme:db/foreign@1.0.0",
    generate_all,
});

struct Foreign;

impl Guest for Foreign {
    fn run() -> Result<(), String> {
        let _ = acme::db::query::run("select 1");
        Ok(())
    }
}

export!(Foreign);
