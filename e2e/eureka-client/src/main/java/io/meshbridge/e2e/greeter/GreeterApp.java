package io.meshbridge.e2e.greeter;

import org.springframework.beans.factory.annotation.Value;
import org.springframework.boot.SpringApplication;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.web.bind.annotation.GetMapping;
import org.springframework.web.bind.annotation.RestController;

/**
 * One endpoint that names the instance, so a test can tell which instance
 * answered through Envoy. Registration in Eureka is the starter's doing.
 */
@SpringBootApplication
@RestController
public class GreeterApp {
    @Value("${greeter.reply}")
    private String reply;

    @GetMapping("/")
    public String hello() {
        return reply;
    }

    public static void main(String[] args) {
        SpringApplication.run(GreeterApp.class, args);
    }
}
