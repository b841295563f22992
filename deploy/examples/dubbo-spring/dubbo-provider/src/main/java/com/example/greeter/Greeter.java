package com.example.greeter;

/** The one service: tells which provider instance answered. */
public interface Greeter {
    /** This instance's id (the {@code greeter.instance-id} property). */
    String whoami();
}
