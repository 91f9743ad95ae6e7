package pml.local;

import java.nio.file.Path;
import org.neo4j.configuration.GraphDatabaseSettings;
import org.neo4j.configuration.connectors.BoltConnector;
import org.neo4j.configuration.helpers.SocketAddress;
import org.neo4j.dbms.api.DatabaseManagementService;
import org.neo4j.dbms.api.DatabaseManagementServiceBuilder;
import org.neo4j.io.ByteUnit;

/**
 * Runs a Neo4j community DBMS with a Bolt connector on loopback until the process is stopped.
 *
 * <p>Usage: {@code Neo4jServer <data-dir> <bolt-port> [page-cache-mb]}. Prints "PML_NEO4J_READY"
 * on stdout once Bolt accepts connections, so launchers can wait for it.
 */
public final class Neo4jServer {
  private Neo4jServer() {}

  public static void main(String[] args) throws InterruptedException {
    if (args.length < 2) {
      System.err.println("usage: Neo4jServer <data-dir> <bolt-port> [page-cache-mb]");
      System.exit(2);
    }
    Path home = Path.of(args[0]).toAbsolutePath();
    int port = Integer.parseInt(args[1]);
    long pageCacheMb = args.length > 2 ? Long.parseLong(args[2]) : 256;

    DatabaseManagementService dbms =
        new DatabaseManagementServiceBuilder(home)
            .setConfig(BoltConnector.enabled, true)
            .setConfig(BoltConnector.listen_address, new SocketAddress("127.0.0.1", port))
            .setConfig(GraphDatabaseSettings.auth_enabled, false)
            .setConfig(GraphDatabaseSettings.pagecache_memory, ByteUnit.mebiBytes(pageCacheMb))
            .build();
    Runtime.getRuntime().addShutdownHook(new Thread(dbms::shutdown, "neo4j-shutdown"));
    dbms.database(GraphDatabaseSettings.DEFAULT_DATABASE_NAME); // fails fast if it cannot start
    System.out.println("PML_NEO4J_READY bolt://127.0.0.1:" + port);
    System.out.flush();
    Thread.currentThread().join();
  }
}
