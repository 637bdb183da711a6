// Creates ACLs with Kafka's own Admin API: aiokafka has no CreateAcls call, and the kafka-tools jar
// (kafka-acls.sh) is not among the broker's runtime jars. Run by the JDK's source launcher:
//   java -cp '<libs>/*' SecureAcls.java <admin client properties>  < acl lines
// Each stdin line: resourceType patternType name principal operation [permission] (e.g. TOPIC LITERAL x.ingest
// User:host WRITE; the permission is ALLOW unless the line ends with DENY, which wins over any ALLOW).
// Creating an ACL that exists is a no-op for Kafka, so running this again is safe.

import java.io.BufferedReader;
import java.io.FileInputStream;
import java.io.InputStreamReader;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.common.acl.AccessControlEntry;
import org.apache.kafka.common.acl.AclBinding;
import org.apache.kafka.common.acl.AclOperation;
import org.apache.kafka.common.acl.AclPermissionType;
import org.apache.kafka.common.resource.PatternType;
import org.apache.kafka.common.resource.ResourcePattern;
import org.apache.kafka.common.resource.ResourceType;

public class SecureAcls {
    public static void main(String[] args) throws Exception {
        Properties config = new Properties();
        try (FileInputStream in = new FileInputStream(args[0])) {
            config.load(in);
        }
        List<AclBinding> bindings = new ArrayList<>();
        BufferedReader lines = new BufferedReader(new InputStreamReader(System.in));
        for (String line = lines.readLine(); line != null; line = lines.readLine()) {
            String[] f = line.strip().split("\\s+");
            if (f.length != 5 && f.length != 6) {
                if (line.isBlank()) continue;
                throw new IllegalArgumentException("expected 5 or 6 fields, got: " + line);
            }
            AclPermissionType permission = f.length == 6 ? AclPermissionType.fromString(f[5]) : AclPermissionType.ALLOW;
            if (permission != AclPermissionType.ALLOW && permission != AclPermissionType.DENY) {
                throw new IllegalArgumentException("permission must be ALLOW or DENY, got: " + line);
            }
            bindings.add(new AclBinding(
                new ResourcePattern(ResourceType.fromString(f[0]), f[2], PatternType.fromString(f[1])),
                new AccessControlEntry(f[3], "*", AclOperation.fromString(f[4]), permission)));
        }
        try (Admin admin = Admin.create(config)) {
            admin.createAcls(bindings).all().get();
        }
        System.out.println("created " + bindings.size() + " ACL binding(s)");
    }
}
