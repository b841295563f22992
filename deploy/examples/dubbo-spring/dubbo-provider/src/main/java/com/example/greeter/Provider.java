package com.example.greeter;

import org.apache.dubbo.config.ServiceConfig;
import org.apache.dubbo.config.bootstrap.DubboBootstrap;

/**
 * Exports {@link Greeter} and blocks until the JVM is told to stop; Dubbo's
 * shutdown hook then unregisters it from the registry.
 *
 * <p>Everything else is Dubbo's own configuration, from dubbo.properties
 * and -D system properties (which win): {@code dubbo.registry.address}
 * ({@code zookeeper://host:2181} or {@code nacos://host:8848}),
 * {@code dubbo.registry.register-mode} ({@code interface}, {@code instance}
 * or {@code all}), {@code dubbo.protocol.port}, {@code dubbo.protocol.host}.
 */
public final class Provider {
    public static void main(String[] args) {
        String id = System.getProperty("greeter.instance-id", "greeter");
        ServiceConfig<Greeter> service = new ServiceConfig<>();
        service.setInterface(Greeter.class);
        service.setRef(new GreeterImpl(id));
        service.setVersion(System.getProperty("greeter.version", "1.0.0"));
        DubboBootstrap.getInstance().service(service).start();
        System.out.println("greeter provider " + id + " started");
        DubboBootstrap.getInstance().await();
    }
}
