//! Test guest: a valid component of a world vvm-host does not run.

wit_bindgen::generate!({
    inline: "
        package test:other;
        world other {
            export greet: func() -> string;
        }
    ",
});

struct Other;

impl Guest for Other {
    fn greet() -> String {
        "hello".to_owned()
    }
}

export!(Other);
