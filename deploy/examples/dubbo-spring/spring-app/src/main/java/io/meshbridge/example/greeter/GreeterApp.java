package io.meshbridge.example.greeter;

import org.springframework.beans.factory.annotation.Value;
import org.springframework.boot.SpringApplication;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.web.bind.annotation.GetMapping;
import org.springframework.web.bind.annotation.RestController;

/**
 * Answers with its instance id, so a caller can tell which instance served
 * it through the mesh. Registration in the registry is the discovery
 * starter's doing (see application.properties).
 */
@SpringBootApplication
@RestController
public class GreeterApp {
    @Value("${greeter.instance-id}")
    private String instanceId;

    @GetMapping({"/", "/hello"})
    public String hello() {
        return instanceId;
    }

    public static void main(String[] args) {
        SpringApplication.run(GreeterApp.class, args);
    }
}
