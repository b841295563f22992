package io.meshbridge.e2e.nacos;

import com.alibaba.nacos.NacosServerBasicApplication;
import com.alibaba.nacos.NacosServerWebApplication;
import com.alibaba.nacos.core.listener.startup.NacosStartUp;
import com.alibaba.nacos.core.listener.startup.NacosStartUpManager;
import com.alibaba.nacos.sys.env.DeploymentType;
import com.alibaba.nacos.sys.env.EnvUtil;
import org.springframework.boot.Banner;
import org.springframework.boot.WebApplicationType;
import org.springframework.boot.builder.SpringApplicationBuilder;
import org.springframework.context.ConfigurableApplicationContext;

/**
 * Starts Nacos the way its 3.x bootstrap does in the {@code server}
 * deployment type: a core context without a web server (persistence,
 * consistency, cluster membership), then the server web context (the open
 * and admin HTTP APIs, naming, config, and the gRPC servers) as its child.
 * The console and the MCP registry are left out: the tests use neither.
 *
 * <p>Settings come from {@code application.properties} here and from
 * {@code -D} options the test passes (ports, {@code nacos.home}, auth).
 */
public final class NacosTestServer {

    private NacosTestServer() {
    }

    public static void main(String[] args) {
        EnvUtil.setDeploymentType(DeploymentType.SERVER);
        NacosStartUpManager.start(NacosStartUp.CORE_START_UP_PHASE);
        ConfigurableApplicationContext core = new SpringApplicationBuilder(NacosServerBasicApplication.class)
                .web(WebApplicationType.NONE)
                .bannerMode(Banner.Mode.OFF)
                .run(args);
        NacosStartUpManager.start(NacosStartUp.WEB_START_UP_PHASE);
        new SpringApplicationBuilder(NacosServerWebApplication.class)
                .parent(core)
                .bannerMode(Banner.Mode.OFF)
                .run(args);
    }
}
