package com.example.greeter;

/** Answers with the id it was started with. */
public final class GreeterImpl implements Greeter {
    private final String id;

    public GreeterImpl(String id) {
        this.id = id;
    }

    @Override
    public String whoami() {
        return id;
    }
}
